"""Admin actions on real processes: drain and undrain (a worker, a host), retry, bulk retry,
requeue (a lost queue entry, a stuck worker), unload; and what submitters may not do."""

import os
import time

import pytest
from click.testing import CliRunner
from redis import Redis

from gpuq import store
from gpuq.cli.client import ApiError, GpuqClient
from gpuq.cli.main import main
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Role
from gpuq.jobs.enqueue import remove_queued
from gpuq.queue_names import Priority, QueueEntry, queue_name
from tests.e2e.conftest import until

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}
# At temperature 0 SmolLM2 keeps counting to max_tokens (about 60 tokens/s on two cores).
LONG = {"kind": "generate", "model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "temperature": 0}
WAIT_S = 60.0


def _until(what, check, timeout_s=WAIT_S):
    return until(what, check, timeout_s)


def _worker(client, name):
    return next(w for w in client.workers()["data"] if w["name"] == name)


def _status(client, job_id, status):
    return _until(f"{job_id} {status}", lambda: (job := client.job(job_id))["status"] == status and job)


def _stays_queued(client, ids, seconds=2.5):
    """Long enough for an idle worker to have taken them several times over."""
    time.sleep(seconds)
    return [client.job(i)["status"] for i in ids] == ["queued"] * len(ids)


def _queued_ids(processes, model=MODEL, kind="noop"):
    redis = Redis.from_url(processes.redis_url)
    try:
        return [
            x.decode() for x in redis.lrange(f"rq:queue:{queue_name(model, kind, Priority.NORMAL, 'admin')}", 0, -1)
        ]
    finally:
        redis.close()


def test_a_drained_worker_finishes_its_job_takes_no_more_and_resumes_when_undrained(processes):
    _api, url = processes.start_api()
    _proc, name = processes.start_worker()
    with processes.client(url) as client:
        running = client.submit(LONG | {"max_tokens": 240})
        _status(client, running["id"], "running")
        drained = client.drain(name)
        assert drained["state"] == "draining" and drained["current_job"] == running["id"]
        assert drained["drained_by"] == ["worker"]
        waiting = [client.submit(NOOP)["id"] for _ in range(3)]
        assert client.wait(running["id"])["status"] == "succeeded"  # the running job finishes
        _until("drained", lambda: _worker(client, name)["state"] == "drained")
        assert _stays_queued(client, waiting)
        drained_beat = _worker(client, name)["last_heartbeat"]
        # A drained worker stays alive and heartbeating: a later heartbeat comes.
        _until("a heartbeat of the drained worker", lambda: _worker(client, name)["last_heartbeat"] != drained_beat)

        assert client.drain(name, undo=True)["drained_by"] == []
        done = [client.wait(i, timeout_s=WAIT_S) for i in waiting]
    assert [j["status"] for j in done] == ["succeeded"] * 3
    assert {j["worker"] for j in done} == {name}
    assert [j["id"] for j in sorted(done, key=lambda j: j["started_at"])] == waiting  # order kept


def test_a_host_drain_holds_workers_started_afterwards_until_undrained(processes):
    _api, url = processes.start_api()
    _first, first = processes.start_worker("first")
    with processes.client(url) as client:
        host = _worker(client, first)["host"]
        drained = client.drain_host(host)
        assert drained["changed"] and [w["name"] for w in drained["workers"]] == [first]
        _later, later = processes.start_worker("later")
        assert host in client.workers()["drained_hosts"]
        ids = [client.submit(NOOP)["id"] for _ in range(4)]
        assert _stays_queued(client, ids)
        states = {w["name"]: (w["state"], w["drained_by"]) for w in client.workers()["data"]}
        assert states == {first: ("drained", ["host"]), later: ("drained", ["host"])}

        assert client.drain_host(host)["changed"] is False  # idempotent
        undrained = client.drain_host(host, undo=True)
        assert undrained["changed"] and undrained["drained"] is False
        done = [client.wait(i) for i in ids]
    assert [j["status"] for j in done] == ["succeeded"] * 4


def _fragile_models(processes, client, model_path, names):
    """Models whose files vanish before any worker loads them: their jobs fail as a broken
    file would make them fail. Returns a function that puts the files back."""
    links = [processes.workdir / "models" / f"{n}.gguf" for n in names]
    for name, link in zip(names, links, strict=True):
        link.symlink_to(model_path)
        client.register_model({"name": name, "path": link.name})

    def remove():
        for link in links:
            os.unlink(link)

    def restore():
        for link in links:
            link.symlink_to(model_path)

    return remove, restore


def test_retrying_a_failed_job_runs_it_again_under_the_same_id(processes, model_path):
    _api, url = processes.start_api()
    with processes.client(url) as client:
        remove, restore = _fragile_models(processes, client, model_path, ["fragile"])
        job = client.submit({"kind": "generate", "model": "fragile", "prompt": "Hi", "max_tokens": 4})
        remove()
        processes.start_worker()
        failed = client.wait(job["id"])
        assert failed["status"] == "failed" and "fragile.gguf" in failed["error"]

        restore()  # the admin fixed the file
        retried = client.retry(job["id"])
        assert retried["id"] == job["id"] and retried["status"] in ("queued", "running", "succeeded")
        assert retried["error"] is None
        done = client.wait(job["id"])
        assert done["status"] == "succeeded" and done["completion_tokens"] == 4 and done["error"] is None
        assert done["attempts"] == 2  # both runs counted

        with pytest.raises(ApiError) as refused:
            client.retry(job["id"])
        assert refused.value.status == 409 and "succeeded" in refused.value.detail
        assert client.job(job["id"]) == done  # nothing changed


def test_bulk_retry_touches_exactly_the_failed_jobs_the_filter_selects(processes, model_path):
    _api, url = processes.start_api()
    with processes.client(url) as client:
        remove, restore = _fragile_models(processes, client, model_path, ["fragile", "brittle"])
        prompt = {"kind": "generate", "prompt": "Hi", "max_tokens": 2}
        fragile = [client.submit(prompt | {"model": "fragile"})["id"] for _ in range(2)]
        brittle = client.submit(prompt | {"model": "brittle"})["id"]
        fine = client.submit(NOOP)["id"]
        remove()
        processes.start_worker()
        assert [client.wait(i)["status"] for i in [*fragile, brittle, fine]] == ["failed"] * 3 + ["succeeded"]
        restore()

        assert client.retry_jobs(model="fragile") == {"matched": 2, "changed": 2}
        assert [client.wait(i)["status"] for i in fragile] == ["succeeded", "succeeded"]
        assert client.job(brittle)["status"] == "failed"  # another model: untouched
        assert client.job(fine)["attempts"] == 1
        # Again: they match no more (they succeeded), so nothing changes.
        assert client.retry_jobs(model="fragile") == {"matched": 0, "changed": 0}


def test_requeue_pushes_a_lost_queue_entry_again_and_the_job_runs(processes):
    _api, url = processes.start_api()
    redis = Redis.from_url(processes.redis_url)
    with processes.client(url) as client:
        job = client.submit(NOOP)
        remove_queued(redis, [QueueEntry(job["id"], MODEL, "noop", Priority.NORMAL, "admin")])  # Redis lost it
        assert _queued_ids(processes) == []

        requeued = client.requeue(job["id"])
        assert "enqueued again" in requeued["action"] and requeued["job"]["status"] == "queued"
        assert _queued_ids(processes) == [job["id"]]
        again = client.requeue(job["id"])
        assert "nothing to do" in again["action"] and _queued_ids(processes) == [job["id"]]  # no duplicate

        processes.start_worker()
        done = client.wait(job["id"])
    redis.close()
    assert done["status"] == "succeeded" and done["attempts"] == 1


def test_requeue_takes_a_running_job_back_from_its_worker_without_cancelling_it(processes):
    _api, url = processes.start_api()
    _proc, name = processes.start_worker()
    with processes.client(url) as client:
        job = client.submit(LONG | {"max_tokens": 160})
        _status(client, job["id"], "running")
        requeued = client.requeue(job["id"])
        assert requeued["job"]["status"] == "queued" and "taken back from worker" in requeued["action"]
        # The worker stops the old run; its "cancelled" outcome is discarded, and the job
        # runs again (here on the same worker) to the end.
        done = client.wait(job["id"], timeout_s=120)
    assert done["status"] == "succeeded" and done["completion_tokens"] == 160
    assert done["attempts"] == 2 and done["cancel_requested"] is False and done["worker"] == name


def test_unload_frees_the_model_on_every_worker_holding_it(processes):
    _api, url = processes.start_api()
    _proc, name = processes.start_worker()
    with processes.client(url) as client:
        client.wait(client.submit({"kind": "generate", "model": MODEL, "prompt": "Hi", "max_tokens": 2})["id"])
        _until("loaded", lambda: _worker(client, name)["loaded_models"] == [MODEL])

        with pytest.raises(ApiError) as not_held:
            client.unload("no-such-model", worker=name)
        assert not_held.value.status == 409 and MODEL in not_held.value.detail
        with pytest.raises(ApiError) as unknown:
            client.unload("no-such-model")
        assert unknown.value.status == 404
        assert _worker(client, name)["loaded_models"] == [MODEL]  # nothing changed

        assert client.unload(MODEL) == {"model": MODEL, "workers": [name]}
        _until("unloaded", lambda: _worker(client, name)["loaded_models"] == [], timeout_s=5)
        assert client.unload(MODEL)["workers"] == []  # nobody holds it now
        # The next job loads it again.
        again = client.wait(client.submit({"kind": "generate", "model": MODEL, "prompt": "Hi", "max_tokens": 2})["id"])
    assert again["status"] == "succeeded" and again["load_ms"] > 0


def test_submitters_are_refused_admin_actions_and_do_not_see_other_tenants_jobs(processes):
    _api, url = processes.start_api()
    _proc, name = processes.start_worker()
    acme_key, globex_key = (_submitter(processes, owner) for owner in ("acme", "globex"))
    with processes.client(url) as admin, _client(url, acme_key) as acme, _client(url, globex_key) as globex:
        acme_job = acme.submit(NOOP)
        acme.wait(acme_job["id"])
        for action in (
            acme.workers,
            lambda: acme.drain(name),
            lambda: acme.drain_host("anywhere"),
            lambda: acme.unload(MODEL),
            lambda: acme.requeue(acme_job["id"]),
        ):
            with pytest.raises(ApiError) as refused:
                action()
            assert refused.value.status == 403 and "admin" in refused.value.detail
        with pytest.raises(ApiError) as hidden:
            globex.retry(acme_job["id"])
        assert hidden.value.status == 404
        with pytest.raises(ApiError) as refused:
            globex.retry_jobs(status=["failed"], owner="acme")
        assert refused.value.status == 403
        # Bad input: clear 4xx, nothing changes.
        for call, status in (
            (lambda: admin.drain("no-such-worker"), 404),
            (lambda: admin.drain_host("no-such-host"), 404),
            (lambda: admin.retry(acme_job["id"]), 409),
            (lambda: admin.retry("job_missing"), 404),
        ):
            with pytest.raises(ApiError) as bad:
                call()
            assert bad.value.status == status, bad.value.detail
        assert _worker(admin, name)["state"] == "idle" and admin.workers()["drained_hosts"] == []
        assert admin.job(acme_job["id"])["status"] == "succeeded"


def _submitter(processes, owner):
    engine = sync_engine(processes.database_url)
    try:
        with sync_sessions(engine)() as session:
            return store.create_api_key(session, name=f"e2e-{owner}", owner=owner, role=Role.SUBMITTER)[1]
    finally:
        engine.dispose()


def _client(url, key):
    return GpuqClient(url, api_key=key)


def test_the_admin_cli_lists_drains_retries_and_reports_refusals(processes):
    _api, url = processes.start_api()
    _proc, name = processes.start_worker()
    runner = CliRunner(env={"GPUQ_API_KEY": processes.admin_key, "GPUQ_API_URL": url})

    def admin(*args):
        return runner.invoke(main, ["admin", *args])

    with processes.client(url) as client:
        done = client.wait(client.submit(NOOP)["id"])
        listing = admin("workers")
        assert listing.exit_code == 0 and name in listing.output and "idle" in listing.output
        drained = admin("drain", name)
        assert drained.exit_code == 0 and f"{name}: drained by worker" in drained.output
        assert _worker(client, name)["state"] == "drained"
        assert admin("undrain", name).exit_code == 0 and _worker(client, name)["state"] == "idle"

        refused = admin("retry", done["id"])
        assert refused.exit_code == 1 and "succeeded" in refused.output and "HTTP 409" in refused.output
        assert "0 of 0 matching jobs queued again" in admin("retry-failed", "--model", MODEL).output
        unknown = admin("drain-host", "no-such-host")
        assert unknown.exit_code == 1 and "HTTP 404" in unknown.output
        assert "no worker holds it" in admin("unload", MODEL).output  # a noop job loads nothing
