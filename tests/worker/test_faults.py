"""GPU faults in the runner: out of memory at load, and repeated CUDA errors.

Neither can happen on a machine without a GPU, so the model loader here is a clearly
named simulation that fails the way llama-cpp-python fails on a GPU that is out of
memory ("Failed to create llama_context"); everything else (SQL, Redis, the cache, the
runner, the real model when the load succeeds) is real.
"""

import threading

from redis import Redis

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.redis_keys import too_small_key
from tests.gpuq.store.test_store import make_job
from worker.engine import LoadedModel
from worker.faults import GpuHealth, hand_back_to_queue, too_small_models
from worker.model_cache import ModelCache
from worker.outcome_writer import OutcomeWriter
from worker.runner import JobRunner

GPU = "GPU-test-0"


class SimulatedOutOfMemoryLoader:
    """Fails the first ``failures`` loads as a CUDA OOM would, then loads the real model."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, spec):
        self.calls += 1
        if self.calls <= self.failures:
            raise ValueError("Failed to create llama_context")
        return LoadedModel(spec.path, n_ctx=spec.n_ctx, embedding=spec.embedding, threads=1, gpu_layers=0)


def make_runner(database_url, redis_url, loader, *, worker="w1", health=None):
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    redis = Redis.from_url(redis_url)
    writer = OutcomeWriter(sessions)
    writer.start()

    def models(name):
        from worker.catalog import ModelInfo

        with sessions() as s:
            m = store.get_model(s, name)
        return ModelInfo(m.name, m.path, 512, m.vram_mib)

    runner = JobRunner(
        sessions=sessions,
        models=models,
        cache=ModelCache(loader, max_loaded=2),
        writer=writer,
        worker_name=worker,
        device=f"cuda:{GPU}",
        gpu_uuids=(GPU,),
        on_gpu=True,
        hand_back=hand_back_to_queue(sessions, redis, worker=worker, gpu_uuids=(GPU,), timeout_s=60),
        health=health,
    )
    return runner, writer, sessions, redis, engine


def test_out_of_memory_once_is_retried_after_evicting_and_the_job_succeeds(session, database_url, redis_url):
    [job] = store.insert_jobs(
        session,
        [make_job(request={"prompt": "Hi", "max_tokens": 2, "temperature": 0.0, "top_p": 1.0, "seed": 1, "stop": []})],
    )
    loader = SimulatedOutOfMemoryLoader(failures=1)
    runner, writer, sessions, redis, engine = make_runner(database_url, redis_url, loader)
    runner.run(job.id, threading.Event())
    writer.stop()
    with sessions() as s:
        row = store.get_job(s, job.id)
    assert row.status == "succeeded" and loader.calls == 2
    assert too_small_models(redis, (GPU,)) == set()
    engine.dispose()


def test_out_of_memory_twice_hands_the_job_back_and_marks_the_gpu_too_small(session, database_url, redis_url):
    [job] = store.insert_jobs(session, [make_job(request={"prompt": "Hi", "max_tokens": 2})])
    runner, writer, sessions, redis, engine = make_runner(database_url, redis_url, SimulatedOutOfMemoryLoader(9))
    runner.run(job.id, threading.Event())
    writer.stop()
    with sessions() as s:
        row = store.get_job(s, job.id)
    assert (row.status, row.worker, row.attempts) == ("queued", None, 1)  # back in line, not failed
    assert redis.lrange("rq:queue:gpuq:smollm2-135m:generate:normal", 0, -1) == [job.id.encode()]
    assert redis.smembers(too_small_key(GPU)) == {b"smollm2-135m"}
    engine.dispose()


def test_three_cuda_errors_in_a_row_mark_the_gpu_unhealthy_and_a_success_resets_the_count():
    marked = []
    health = GpuHealth(marked.append, threshold=3)
    for error in ("CUDA error: an illegal memory access", "CUDA error: launch failure", None):
        health.record(error)
    health.record("ValueError: prompt too long")  # not a CUDA error: also resets
    assert marked == []
    for _ in range(3):
        health.record("ggml_cuda_compute_forward: CUDA error")
    health.record("CUDA error again")
    assert len(marked) == 1 and marked[0].startswith("3 jobs in a row failed with CUDA errors")
