import pytest

from gpuq.jobs.queues import worker_queue_names
from gpuq.queue_names import Priority, parse_queue_name, queue_name


def test_priority_names_parse_case_insensitively_and_order_high_first():
    assert Priority.parse("HIGH") is Priority.HIGH
    assert sorted([Priority.LOW, Priority.HIGH, Priority.NORMAL]) == [Priority.HIGH, Priority.NORMAL, Priority.LOW]


def test_unknown_priority_lists_the_choices():
    with pytest.raises(ValueError, match="use one of: high, normal, low"):
        Priority.parse("urgent")


def test_queue_names_round_trip_and_refuse_foreign_names():
    name = queue_name("smollm2-135m", "embed", Priority.LOW)
    assert name == "gpuq:smollm2-135m:embed:low"
    assert parse_queue_name(name) == ("smollm2-135m", "embed", Priority.LOW)
    for foreign in ("rq:queue:default", "gpuq:a:low", "gpuq:m:chat:low", "gpuq:m:embed:urgent", "gpuq:../x:embed:low"):
        with pytest.raises(ValueError):
            parse_queue_name(foreign)


def test_model_names_that_would_break_queue_names_are_refused():
    for bad in ("", "a:b", "a b", "-leading-dash", "x" * 129):
        with pytest.raises(ValueError):
            queue_name(bad, "generate", Priority.NORMAL)


def test_a_worker_listens_to_every_high_queue_before_any_normal_queue():
    assert worker_queue_names([("a", "generate"), ("b", "embed")]) == [
        "gpuq:a:generate:high",
        "gpuq:b:embed:high",
        "gpuq:a:generate:normal",
        "gpuq:b:embed:normal",
        "gpuq:a:generate:low",
        "gpuq:b:embed:low",
    ]


def test_loaded_models_come_first_then_models_no_other_worker_holds():
    servable = [("a", "generate"), ("b", "generate"), ("c", "generate")]
    names = worker_queue_names(servable, loaded=frozenset({"c"}), loaded_elsewhere=frozenset({"a"}), worker="w1")
    assert names[:3] == ["gpuq:c:generate:high", "gpuq:b:generate:high", "gpuq:a:generate:high"]
    assert names[3] == "gpuq:c:generate:normal"


def test_idle_workers_that_know_nothing_prefer_different_models():
    servable = [(m, "generate") for m in "abcdef"]
    firsts = {worker_queue_names(servable, worker=f"host.gpu{i}.1")[0] for i in range(8)}
    assert len(firsts) > 1  # rendezvous hashing spreads first choices across models
