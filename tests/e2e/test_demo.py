"""`gpuq demo` (what `make demo` runs) on a fresh data directory: greedy answers a newcomer can
trust, and its own output only, no worker or llama.cpp line between the answers."""

import os
import subprocess
import sys


def test_the_demo_answers_paris_and_prints_no_worker_lines(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")} | {
        "GPUQ_DATA_DIR": str(tmp_path / "data"),
        "GPUQ_WORKER_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "gpuq.cli", "demo"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    output = done.stdout + done.stderr
    answer = output.split("capital of France?", 1)[1].splitlines()[1]
    assert "Paris" in answer, output
    assert " INFO " not in output and "worker.batching" not in output, output
    assert " ERROR " not in output, output  # its workers stopped as asked: no crash reported
