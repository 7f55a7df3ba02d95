"""A stop lets running jobs finish, however many SIGTERMs reach the worker.

`gpuq up` used to kill its supervisor 30 s into a stop; the kernel then sent the workers
their death signal (``gpuq.children``), a second SIGTERM, and RQ took a second signal for a
cold stop: every sequence was thrown away mid-decode and left `running`, to be decoded again
from the start. Caused for real here: the supervisor told to stop, then killed while its
worker decodes."""

import os
import signal
import time
from pathlib import Path

from tests.e2e.conftest import wait_until

MODEL = "smollm2-135m"
# At temperature 0 SmolLM2 keeps counting to max_tokens (about 60 tokens/s on two cores).
LONG = {"kind": "generate", "model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "temperature": 0}


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_worker_sent_its_death_signal_while_draining_still_finishes_its_job(processes):
    _api, url = processes.start_api()
    supervisor, [worker] = processes.start_supervisor(expected_workers=1)
    with processes.client(url) as client:
        job = client.submit(LONG | {"max_tokens": 400})
        wait_until(lambda: client.job(job["id"])["status"] == "running", "the job never started")
        wait_until(lambda: (client.job(job["id"])["runs"] or [{}])[0].get("worker"), "no run recorded")
        supervisor.popen.send_signal(signal.SIGTERM)  # a stop: the supervisor sends its worker SIGTERM
        # RQ takes a second signal within a second of the first for a duplicate; gpuq up's
        # kill came 30 s later.
        time.sleep(2)
        os.kill(supervisor.popen.pid, signal.SIGKILL)  # killed mid-drain: the worker's death signal follows
        supervisor.popen.wait()
        done = client.wait(job["id"], timeout_s=180)
    wait_until(lambda: _gone(worker.pid), "the worker never exited after its job", 60)
    assert done["status"] == "succeeded" and done["attempts"] == 1
    assert done["completion_tokens"] == 400  # decoded once, to its end: no cold stop, no rerun
    assert [(r["outcome"], r["refunded"]) for r in done["runs"]] == [("succeeded", False)]
    # The worker writes to its supervisor's log.
    assert "SIGTERM again while finishing its jobs: still finishing them" in supervisor.log.read_text()


def test_a_stopped_supervisor_and_its_idle_workers_are_gone_in_seconds(processes):
    """RQ's command listener waited up to a minute for a message before it saw a stop, and
    with redis-py 8.2 a worker's teardown waits for that listener: every stop of an idle
    fleet (the supervisor's drain, `gpuq up`'s Ctrl-C, a killed parent's orphans) took a
    minute. The bound here is far above the second or two a stop takes and far below that."""
    processes.settings |= {"GPUQ_SIMULATED_GPUS": "24,24,48,80"}
    supervisor, workers = processes.start_supervisor(expected_workers=4)
    pids = [w.pid for w in workers]
    supervisor.popen.send_signal(signal.SIGTERM)
    wait_until(lambda: supervisor.popen.poll() is not None, "the supervisor was still draining idle workers", 30)
    assert supervisor.popen.returncode == 0
    assert all(_gone(pid) for pid in pids)
