"""What a worker records about each job besides its result: energy and GPU-seconds on the
row, and the Prometheus counters in Redis. Real SQL, Redis, runner, cache, writer and
model; only NVML is replaced, by a clearly named SIMULATED energy source."""

import pytest
from redis import Redis

from gpuq import store
from gpuq.db.tables import JobStatus
from gpuq.stats import metrics
from tests.conftest import both_databases
from tests.gpuq.store.test_store import make_job
from tests.metrics_parsing import samples, total, value
from tests.worker.generation import real_runner, run_jobs
from tests.worker.simulated_energy import SimulatedEnergySource, constant
from worker.energy import EnergyMeter

MODEL = "smollm2-135m"
GEN = {"prompt": "Count: one, two,", "max_tokens": 6, "temperature": 0.0, "top_p": 1.0, "seed": 1, "stop": []}


@pytest.fixture
def worker(database_url, redis_url):
    """A runner as worker/main.py wires it, with a simulated 200 W GPU behind the meter. No
    prompt is reused from the KV cache: every token a job counts is one the GPU decoded."""
    redis_for_metrics = Redis.from_url(redis_url)

    def on_load(spec, seconds):
        metrics.record_model_load(redis_for_metrics, spec.name, seconds)

    with real_runner(
        database_url,
        redis_url,
        on_load=on_load,
        device="cuda:GPU-test-0",
        gpu_uuids=("GPU-test-0",),
        energy=EnergyMeter([SimulatedEnergySource(constant(200.0), has_counter=True)]),
        prompt_cache=False,
    ) as parts:
        yield parts.runner, parts.writer, parts.sessions, parts.redis
    redis_for_metrics.close()


def scrape(redis: Redis, sessions) -> dict:
    with sessions() as s:
        gpus = store.list_gpus(s)
    snapshot = metrics.read_snapshot(redis, queues=[(MODEL, "generate")], gpus=gpus)
    return samples(metrics.render(snapshot).decode())


@both_databases
def test_a_gpu_job_records_its_energy_and_gpu_seconds_and_is_counted_once(session, worker):
    runner, writer, sessions, redis = worker
    jobs = store.insert_jobs(session, [make_job(request=GEN), make_job(request=GEN)])
    for job in jobs:
        run_jobs(runner, [job.id])
    assert writer.flush()
    with sessions() as s:
        rows = [store.get_job(s, j.id) for j in jobs]
    for row in rows:
        assert row.status == "succeeded"
        assert row.gpu_seconds > 0
        # 200 W for the job's wall time (the load included), read from the counter
        assert row.energy_j == pytest.approx(200.0 * row.gpu_seconds, rel=0.05)
        assert row.gpu_seconds * 1000 >= row.run_ms + (row.load_ms or 0) - 2  # the whole job, ms rounding

    parsed = scrape(redis, sessions)
    assert value(parsed, "gpuq_jobs_total", model=MODEL, kind="generate", status="succeeded") == 2
    assert value(parsed, "gpuq_tokens_generated_total", model=MODEL) == sum(r.completion_tokens for r in rows)
    assert value(parsed, "gpuq_job_run_seconds_count", model=MODEL, kind="generate") == 2
    assert value(parsed, "gpuq_job_run_seconds_sum", model=MODEL, kind="generate") == pytest.approx(
        sum(r.run_ms for r in rows) / 1000, abs=0.01
    )
    assert value(parsed, "gpuq_job_run_seconds_bucket", model=MODEL, kind="generate", le="+Inf") == 2
    assert value(parsed, "gpuq_job_queue_wait_seconds_count", model=MODEL, kind="generate") == 2
    waits = sum(r.queue_wait_ms for r in rows) / 1000
    assert value(parsed, "gpuq_job_queue_wait_seconds_sum", model=MODEL, kind="generate") == pytest.approx(
        waits, abs=0.01
    )
    assert value(parsed, "gpuq_model_loads_total", model=MODEL) == 1  # the second job found it loaded
    assert value(parsed, "gpuq_model_load_seconds_count", model=MODEL) == 1
    assert total(parsed, "gpuq_jobs_total") == 2


@both_databases
def test_generations_decoded_together_share_the_gpus_energy_by_their_tokens(session, worker):
    runner, writer, sessions, _redis = worker
    jobs = store.insert_jobs(
        session, [make_job(request=GEN | {"max_tokens": 24}), make_job(request=GEN | {"max_tokens": 24})]
    )
    run_jobs(runner, [store.insert_jobs(session, [make_job(request=GEN)])[0].id])  # loads the model
    run_jobs(runner, [job.id for job in jobs])
    assert writer.flush()
    with sessions() as s:
        rows = [store.get_job(s, j.id) for j in jobs]
    assert [r.status for r in rows] == ["succeeded", "succeeded"]
    # Same prompt, same length, side by side: each is charged about half of the GPU (the run
    # admits the second a few steps after the first, so each shares a little less than its
    # whole life with the other: a little over half)...
    assert all(0.4 < r.energy_share < 0.65 for r in rows)
    for row in rows:
        assert row.energy_j == pytest.approx(200.0 * row.gpu_seconds, rel=0.05)
    # ...so the GPU's energy over the run is counted about once, not once per job (2.0).
    assert 0.9 < sum(r.energy_share for r in rows) < 1.25


@both_databases
def test_a_late_outcome_of_a_job_run_again_elsewhere_is_not_counted(session, worker):
    runner, writer, sessions, redis = worker
    [job] = store.insert_jobs(session, [make_job(kind="noop", request={})])
    with sessions() as s:  # another worker claimed it first (as after a reconciliation)
        store.claim_job(s, job.id, worker="w-other", device="cpu")
        store.return_to_queue(s, job.id, worker="w-other", reason="its worker died")
        store.claim_job(s, job.id, worker="w-other", device="cpu")
    runner.run_noop(job.id)  # finds it no longer queued: nothing to count
    late = store.Outcome(job_id=job.id, worker="w1", status=JobStatus.SUCCEEDED, finished_at=job.created_at)
    writer.submit(late, metrics.FinishedJob(MODEL, "noop", "succeeded", 0.1, 0.1))
    assert writer.flush()
    assert total(scrape(redis, sessions), "gpuq_jobs_total") == 0
