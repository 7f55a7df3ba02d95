"""GPU faults in the runner: out of memory at load, and repeated CUDA errors.

Running out of GPU memory cannot happen on a machine without a GPU, so the model loader
here is a clearly named simulation that fails the way llama-cpp-python fails on a GPU that
is out of memory ("Failed to create llama_context"). What the GPU's memory looks like then
(empty, or held by another process) is read through real pynvml from the NVML stand-in;
everything else (SQL, Redis, the cache, the runner, the real model when the load
succeeds) is real.
"""

import threading
import time

from redis import Redis

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.fleet import health
from gpuq.redis_keys import too_small_key
from tests.gpuq.store.test_store import make_job
from tests.nvml_standin import StandinProcess, gpu_uuid
from tests.worker.generation import run_jobs
from worker.catalog import ModelInfo
from worker.decoding import Finished
from worker.engine import LoadedModel
from worker.faults import GpuHealth, StepBack, hand_back_to_queue, send_back_to_queue
from worker.gpu_memory import GpuMemory
from worker.model_cache import ModelCache
from worker.outcome_writer import OutcomeWriter
from worker.runner import JobRunner

GPU = gpu_uuid(0)  # the stand-in's 80 GiB GPU
MODEL = "smollm2-135m"


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


def make_runner(database_url, redis_url, loader, *, worker="w1", health=None, too_small_ttl_s=60.0):
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    redis = Redis.from_url(redis_url)
    writer = OutcomeWriter(sessions)
    writer.start()
    step_back = StepBack()

    def models(name):
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
        hand_back=hand_back_to_queue(
            sessions,
            redis,
            worker=worker,
            gpu_uuids=(GPU,),
            timeout_s=60,
            too_small_ttl_s=too_small_ttl_s,
            others_hold=GpuMemory((GPU,)).held_by_others,
            step_back=step_back,
        ),
        health=health,
    )
    return runner, writer, sessions, redis, engine, step_back


def run_one(session, database_url, redis_url, loader, **options):
    [job] = store.insert_jobs(
        session,
        [make_job(request={"prompt": "Hi", "max_tokens": 2, "temperature": 0.0, "top_p": 1.0, "seed": 1, "stop": []})],
    )
    runner, writer, sessions, redis, engine, step_back = make_runner(database_url, redis_url, loader, **options)
    run_jobs(runner, [job.id])
    writer.stop()
    with sessions() as s:
        row = store.get_job(s, job.id)
    engine.dispose()
    return job, row, redis, step_back


def test_out_of_memory_once_is_retried_after_evicting_and_the_job_succeeds(nvml, session, database_url, redis_url):
    loader = SimulatedOutOfMemoryLoader(failures=1)
    _job, row, redis, _step_back = run_one(session, database_url, redis_url, loader)
    assert row.status == "succeeded" and loader.calls == 2
    assert health.too_small_models(redis, (GPU,)) == set()


def test_out_of_memory_on_an_empty_gpu_hands_the_job_back_and_marks_the_gpu_too_small_for_a_while(
    nvml, session, database_url, redis_url
):
    job, row, redis, step_back = run_one(session, database_url, redis_url, SimulatedOutOfMemoryLoader(9))
    assert (row.status, row.worker, row.attempts) == ("queued", None, 1)  # back in line, not failed
    assert redis.lrange(f"rq:queue:gpuq:{MODEL}:generate:normal", 0, -1) == [job.id.encode()]
    assert health.too_small_models(redis, (GPU,)) == {MODEL}
    [(member, until)] = redis.zrange(too_small_key(GPU), 0, -1, withscores=True)
    assert member == MODEL.encode() and 55 < until - time.time() <= 60  # the mark ends, it is not for ever
    assert step_back.models() == set()


def test_out_of_memory_while_another_process_holds_memory_marks_nothing_and_steps_back(
    nvml, session, database_url, redis_url
):
    nvml.processes = [StandinProcess(GPU, pid=31337, used_mib=70_000)]  # someone else's training run
    nvml.write()
    job, row, redis, step_back = run_one(session, database_url, redis_url, SimulatedOutOfMemoryLoader(9))
    assert row.status == "queued" and redis.lrange(f"rq:queue:gpuq:{MODEL}:generate:normal", 0, -1) == [job.id.encode()]
    # Not the model's fault: no other worker is told the GPU is too small, and this one only
    # steps back for a while.
    assert health.too_small_models(redis, (GPU,)) == set() and redis.exists(too_small_key(GPU)) == 0
    assert step_back.models() == {MODEL}


def test_a_too_small_mark_expires_and_clearing_the_gpu_ends_it_at_once(redis, session):
    health.mark_too_small(redis, ("GPU-a",), "m1", ttl_s=0.5)
    health.mark_too_small(redis, ("GPU-a",), "m2", ttl_s=60)
    assert health.too_small_models(redis, ("GPU-a", "GPU-b")) == {"m1", "m2"}
    time.sleep(0.7)
    assert health.too_small_models(redis, ("GPU-a",)) == {"m2"}
    assert health.clear(session, redis, "GPU-a") is False  # not in the inventory: nothing touched
    assert health.too_small_models(redis, ("GPU-a",)) == {"m2"}


def test_a_step_back_lasts_its_time():
    now = [100.0]
    step_back = StepBack(clock=lambda: now[0])
    step_back.add("m", 30)
    assert step_back.models() == {"m"}
    now[0] += 31
    assert step_back.models() == set()


def test_three_cuda_errors_in_a_row_mark_the_gpu_unhealthy_and_a_success_resets_the_count():
    marked = []
    health_count = GpuHealth(marked.append, threshold=3)
    for error in ("CUDA error: an illegal memory access", "CUDA error: launch failure", None):
        health_count.record(error)
    health_count.record("ValueError: prompt too long")  # not a CUDA error: also resets
    assert marked == []
    for _ in range(3):
        health_count.record("ggml_cuda_compute_forward: CUDA error")
    health_count.record("CUDA error again")
    assert len(marked) == 1 and marked[0].startswith("3 jobs in a row failed with CUDA errors")


def test_a_request_without_kv_room_goes_back_to_its_queue_uncharged_and_marks_nothing(
    nvml, session, database_url, redis_url
):
    """The decoder sends the newest request back when llama_decode finds no KV room beside the
    others (``Finished(evicted=True)``): neither the job nor the GPU is at fault."""
    [job] = store.insert_jobs(session, [make_job(request={"prompt": "Hi", "max_tokens": 2, "temperature": 0.0})])
    runner, writer, sessions, redis, engine, step_back = make_runner(
        database_url, redis_url, SimulatedOutOfMemoryLoader(0)
    )
    runner._send_back = send_back_to_queue(sessions, redis, worker="w1", timeout_s=60)
    ready = runner.prepare_generation(runner.claim(job.id), threading.Event(), None)
    runner.admitted(job.id, ready.admit(), 0)
    runner.finish_generation(Finished(job.id, evicted=True))
    writer.stop()
    with sessions() as s:
        row = store.get_job(s, job.id)
    engine.dispose()
    assert (row.status, row.worker, row.attempts) == ("queued", None, 0)  # the attempt refunded
    assert redis.lrange(f"rq:queue:gpuq:{MODEL}:generate:normal", 0, -1) == [job.id.encode()]
    assert health.too_small_models(redis, (GPU,)) == set() and step_back.models() == set()
