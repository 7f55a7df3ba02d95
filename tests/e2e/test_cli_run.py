"""`gpuq run`, `gpuq job`, `gpuq cancel` and `gpuq submit` as a user types them, against
running gpuq processes; the conversation runs on a pseudo-terminal, as on a real one."""

import os
import select
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from tests.e2e.conftest import as_a_foreground_job

MODEL = "smollm2-135m"
CLI = [sys.executable, "-m", "gpuq.cli"]


def _env(system, tmp_path):
    return {**os.environ, "GPUQ_DATA_DIR": str(tmp_path), "GPUQ_API_KEY": system.processes.admin_key}


def _cli(system, tmp_path, *args, stdin=None):
    return subprocess.run(
        [*CLI, *args], input=stdin, capture_output=True, text=True, timeout=300, env=_env(system, tmp_path)
    )


def _latest(system) -> dict:
    [latest] = system.client.jobs(limit=1)["data"]
    return system.client.job(latest["id"])


def test_run_answers_a_prompt_or_stdin_streaming_the_jobs_text(system, tmp_path):
    out = _cli(
        system,
        tmp_path,
        "run",
        "--url",
        system.url,
        MODEL,
        "Name a colour.",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
    )
    assert out.returncode == 0, out.stderr
    job = _latest(system)
    assert out.stdout == job["result"]["text"] + "\n" and job["priority"] == "high"
    assert job["request"]["messages"] == [{"role": "user", "content": "Name a colour."}]  # the chat template
    piped = _cli(
        system,
        tmp_path,
        "run",
        "--url",
        system.url,
        MODEL,
        "--max-tokens",
        "12",
        "--temperature",
        "0",
        stdin="Name a colour.\n",
    )
    assert piped.returncode == 0 and piped.stdout == out.stdout
    missing = _cli(system, tmp_path, "run", "--url", system.url, "no-such-model", "hi")
    assert missing.returncode == 1 and "no-such-model" in missing.stderr and "Traceback" not in missing.stderr


class Terminal:
    def __init__(self, args, env):
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, env=env, preexec_fn=as_a_foreground_job
        )
        os.close(slave)
        self.seen = ""

    def read_until(self, text: str, *, times: int = 1, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while self.seen.count(text) < times:
            ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {text!r} on the terminal; it shows:\n{self.seen}")
            self.seen += os.read(self.master, 4096).decode(errors="replace")
        return self.seen

    def read_more(self, timeout_s: float = 120.0) -> None:
        """Until the terminal shows something new."""
        before = len(self.seen)
        deadline = time.monotonic() + timeout_s
        while len(self.seen) == before:
            ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"nothing new on the terminal; it shows:\n{self.seen}"
            self.seen += os.read(self.master, 4096).decode(errors="replace")

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")


def test_a_conversation_on_a_terminal_where_ctrl_c_cancels_the_answers_job(system, tmp_path):
    terminal = Terminal([*CLI, "run", "--url", system.url, MODEL, "--temperature", "0"], _env(system, tmp_path))
    try:
        terminal.read_until(">>> ")
        terminal.type("Say hello.")
        terminal.read_until(">>> ", times=2, timeout_s=180)  # answered, back at the prompt
        first = _latest(system)
        assert first["status"] == "succeeded" and first["result"]["text"].strip()  # "" would be in any terminal
        assert first["result"]["text"].strip() in terminal.seen.replace("\r", "")

        # At temperature 0 this answer is a count of a thousand tokens and more, so Ctrl-C lands while
        # it runs ("Count from 1 to 1000, one number a line." got 48 tokens after this greeting).
        question = "Write the numbers from 1 to 500, separated by commas."
        terminal.type(question)
        terminal.read_until(question + "\r\n")  # the terminal's echo of what was typed
        terminal.read_more()  # the answer's first text, while the job still runs
        terminal.proc.send_signal(signal.SIGINT)  # Ctrl-C
        terminal.read_until("cancelled job")
        terminal.read_until(">>> ", times=3)
        assert "(running)" not in terminal.seen
        stopped = _latest(system)
        deadline = time.monotonic() + 30
        while stopped["status"] == "running" and time.monotonic() < deadline:
            time.sleep(0.1)
            stopped = system.client.job(stopped["id"])
        assert stopped["status"] == "cancelled" and stopped["completion_tokens"] < 1000
        # The conversation went on with the first exchange: the second carried it.
        assert stopped["request"]["messages"][:2] == [
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": first["result"]["text"]},
        ]
        terminal.type("/bye")
        assert terminal.proc.wait(timeout=30) == 0
    finally:
        if terminal.proc.poll() is None:
            terminal.proc.kill()
        os.close(terminal.master)


def test_submit_prints_the_id_at_once_and_job_and_cancel_read_and_stop_it(system, tmp_path):
    out = _cli(system, tmp_path, "submit", "--url", system.url, MODEL, "Name a colour.", "--max-tokens", "6")
    assert out.returncode == 0, out.stderr
    job_id = out.stderr.split()[0]
    job = system.client.job(job_id)
    assert job["request"]["messages"] == [{"role": "user", "content": "Name a colour."}]  # the chat template
    assert job["result"]["text"].strip(), job  # a text to compare: an empty one would match an empty stdout
    assert out.stdout.strip() == job["result"]["text"].strip()
    raw = _cli(system, tmp_path, "submit", "--url", system.url, MODEL, "1, 2, 3,", "--raw", "--no-wait")
    raw_id = raw.stdout.strip()
    assert system.client.job(raw_id)["request"]["prompt"] == "1, 2, 3,"

    shown = _cli(system, tmp_path, "job", "--url", system.url, job_id)
    assert shown.returncode == 0 and job_id in shown.stdout and "succeeded" in shown.stdout
    assert job["result"]["text"].strip() in shown.stdout

    long = {"kind": "generate", "model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "max_tokens": 1500}
    running = system.client.submit(long | {"temperature": 0})
    deadline = time.monotonic() + 120
    while system.client.job(running["id"])["status"] == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    stopped = _cli(system, tmp_path, "cancel", "--url", system.url, running["id"])
    assert stopped.returncode == 0 and running["id"] in stopped.stdout
    assert system.client.wait(running["id"], timeout_s=60)["status"] == "cancelled"
    again = _cli(system, tmp_path, "cancel", "--url", system.url, running["id"])
    assert again.returncode == 1 and "already cancelled" in again.stderr
    unknown = _cli(system, tmp_path, "job", "--url", system.url, "job_nope")
    assert unknown.returncode == 1 and "does not exist" in unknown.stderr


def test_run_and_submit_with_a_deadline_are_answered_and_their_jobs_carry_it(system, tmp_path):
    # No pace is known that makes an hour too short: both are accepted, answered by a worker,
    # and the deadline sent is the job's.
    before = datetime.now(UTC)
    out = _cli(
        system, tmp_path, "run", "--url", system.url, MODEL, "Name a colour.", "--max-tokens", "8", "--deadline", "1h"
    )
    assert out.returncode == 0, out.stderr
    job = _latest(system)
    assert out.stdout == job["result"]["text"] + "\n"
    deadline = datetime.fromisoformat(job["deadline"]).replace(tzinfo=UTC)
    assert before + timedelta(hours=1) <= deadline <= datetime.now(UTC) + timedelta(hours=1)

    due = (datetime.now(UTC) + timedelta(minutes=30)).replace(microsecond=0)
    submitted = _cli(
        system,
        tmp_path,
        "submit",
        "--url",
        system.url,
        MODEL,
        "Name a colour.",
        "--max-tokens",
        "6",
        "--deadline",
        due.isoformat(),
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stderr.split()[0]
    assert datetime.fromisoformat(system.client.job(job_id)["deadline"]).replace(tzinfo=UTC) == due
    shown = _cli(system, tmp_path, "job", "--url", system.url, job_id)
    assert f"deadline           {due.strftime('%Y-%m-%d %H:%M:%SZ')}\n" in shown.stdout  # answered: not late
