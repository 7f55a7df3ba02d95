"""A planned batch's groups spread over workers' lanes: each family of lines on one worker, the
families spread by prompt bytes, a start all lines share not piling them on one worker, lines
with starts of their own left to the shared queues; a family whose start a worker already
holds goes to that worker, while its share of the batch allows."""

from __future__ import annotations

from gpuq import store
from gpuq.batches.lane_split import spread
from gpuq.batches.openai_format import parse_body
from gpuq.batches.planning import PlannedLine, plan_chain
from gpuq.batches.queue_order import Planning
from gpuq.batches.schedules import store_inline_requests
from gpuq.batches.service import start_batch
from gpuq.db.tables import Job
from gpuq.jobs.prefix_routing import PrefixRouting, prefix_chain
from gpuq.jobs.prompt import unpack_prompt_ids, vocab_tokenizer, vocabulary_file_tag
from gpuq.redis_keys import prefix_index_key, rq_job_key
from tests.conftest import both_databases
from tests.gpuq.jobs.test_lanes import W1, W2, register

SMOLLM = "smollm2-135m"

FAMILY = "Quiz {f}. " + "Here is a worked example of family {f}, as a few-shot start would hold it. " * 8


def line(key: int, prompt: str) -> PlannedLine:
    data = prompt.encode()
    return PlannedLine(key, plan_chain(data), len(data))


def interleaved(families: int, per_family: int, system: str = "") -> list[PlannedLine]:
    return [
        line(q * families + f, system + FAMILY.format(f=f) + f"Question {q}: why?")
        for q in range(per_family)
        for f in range(families)
    ]


def _families(placed: dict[int, str], families: int) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for key, worker in placed.items():
        out.setdefault(key % families, set()).add(worker)
    return out


def test_each_family_goes_to_one_worker_and_the_families_spread_evenly():
    placed = spread(interleaved(8, 8), ["w1", "w2"])
    assert len(placed) == 64
    by_family = _families(placed, 8)
    assert all(len(workers) == 1 for workers in by_family.values())
    assert sorted(w for workers in by_family.values() for w in workers).count("w1") == 4


def test_a_start_every_line_shares_does_not_put_the_batch_on_one_worker():
    system = "You are a careful assistant who answers in one sentence and never more than that. " * 6
    placed = spread(interleaved(8, 8, system), ["w1", "w2"])
    by_family = _families(placed, 8)
    assert all(len(workers) == 1 for workers in by_family.values())
    assert {w for workers in by_family.values() for w in workers} == {"w1", "w2"}


def test_lines_of_their_own_and_a_single_worker_place_nothing():
    own = [line(i, f"Ticket {i}: " + "x" * 600) for i in range(10)]
    assert spread(own, ["w1", "w2"]) == {}
    assert spread(interleaved(4, 4), ["w1"]) == {}


def test_a_group_goes_to_the_worker_holding_its_start_while_its_share_allows():
    lines = interleaved(4, 4)
    family_of = {line.key: line.key % 4 for line in lines}

    def all_held_by_w2(groups: list[list[PlannedLine]]) -> list[str | None]:
        return ["w2"] * len(groups)

    placed = spread(lines, ["w1", "w2"], all_held_by_w2)
    on_w2 = {family_of[k] for k, w in placed.items() if w == "w2"}
    assert len(on_w2) == 2  # w2 holds every start, but takes only its half of the batch

    def family_3_held_by_w2(groups: list[list[PlannedLine]]) -> list[str | None]:
        return ["w2" if family_of[g[0].key] == 3 else None for g in groups]

    placed = spread(lines, ["w1", "w2"], family_3_held_by_w2)
    assert {w for k, w in placed.items() if family_of[k] == 3} == {"w2"}
    assert sorted(placed.values()).count("w2") == 8  # and the rest still spread evenly


@both_databases
def test_a_batch_family_whose_start_a_worker_holds_is_queued_in_that_workers_lane(session, redis, tmp_path):
    """The held starts are found from the batch lines' own tokens, as the API tokenises a
    single request: the chain a worker's prefix index holds after it ran such a request."""
    register(redis, W1, model=SMOLLM)
    register(redis, W2, model=SMOLLM)
    routing = PrefixRouting(on=True, min_blocks=4)
    path = store.find_model(session, SMOLLM).path
    tokenizer = vocab_tokenizer(path)

    def request(family: int, question: int) -> dict:
        system = f"Family {family}. " + f"A worked example of family {family}, as a few-shot start holds it. " * 20
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Question {question}?"}]
        return {"model": SMOLLM, "messages": messages, "max_tokens": 4}

    # W2 ran family 1 and family 2 before (a single request each): its index holds their starts.
    for family in (1, 2):
        params = parse_body("/v1/chat/completions", request(family, 99))[1]
        ids = tokenizer.count_up_to(params, 10_000).ids
        assert ids is not None
        tokens = unpack_prompt_ids(vocabulary_file_tag(path), ids)
        assert tokens is not None
        redis.sadd(prefix_index_key(W2), *prefix_chain(path, "alice", tokens, shared_tenants=False))

    lines = [
        {"custom_id": f"f{f}q{q}", "method": "POST", "url": "/v1/chat/completions", "body": request(f, q)}
        for q in range(4)
        for f in range(4)
    ]
    file = store.save_file(session, store_inline_requests(lines, tmp_path))
    batch = start_batch(
        session,
        redis,
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=None,
        priority=2,
        timeout_s=60,
        owner="alice",
        planning=Planning(routing=routing),
    )
    lane_of = {}
    for job in session.query(Job).filter(Job.batch_id == batch.id):
        origin = redis.hget(rq_job_key(job.id), "origin").decode()
        lane_of[job.custom_id] = origin.rsplit("@", 1)[1] if "@" in origin else ""
    by_family = {f: {lane_of[f"f{f}q{q}"] for q in range(4)} for f in range(4)}
    assert by_family[1] == by_family[2] == {W2}
    assert by_family[0] == by_family[3] == {W1}  # W2's share is full: the load guard
