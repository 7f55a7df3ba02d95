"""One tenant cannot stall another's calls (issue 24 item 1): while one tenant keeps four
hostile chat calls running (huge prompts, no max_tokens, all refused in the end), another
tenant's streamed call gets its first token within a second of what it gets alone.

Two hostile shapes: ~10,000 short messages (~350 KB), refused by their size before any
tokenising; and prompts just small enough to be tokenised (~160 KB in 2,000 messages) and
refused after, which take seconds of tokenizer each: those queue behind each other, in their
tenant's turn, not in front of the other tenant's call (gpuq/jobs/limits.py, prompt.py)."""

from __future__ import annotations

import json
import secrets
import statistics
import threading
import time

import httpx
import pytest

MODEL = "smollm2-135m"
ROUNDS = 3
SLACK_S = 1.0  # the target: within a second of the call's time alone

HOSTILE = {
    "10k-short-messages": [{"role": "user", "content": f"hello there number {i}"} for i in range(10_000)],
    "just-tokenisable": [{"role": "user", "content": ("lorem ipsum dolor sit amet " * 3)[:80]} for _ in range(2_000)],
}


def make_key(system, owner: str) -> str:
    """A fresh key of ``owner``'s (named apart: an owner's active keys have distinct names)."""
    admin = {"Authorization": f"Bearer {system.processes.admin_key}"}
    name = f"{owner}-{secrets.token_hex(3)}"
    made = httpx.post(f"{system.url}/v1/keys", json={"name": name, "owner": owner}, headers=admin, timeout=30)
    assert made.status_code == 201, made.text
    return str(made.json()["key"])


def first_token_s(url: str, key: str) -> float:
    """Seconds from sending a streamed chat call to its first piece of text (read to its end)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    started, first = time.perf_counter(), None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line.removeprefix("data: "))["choices"]
                if choices and choices[0]["delta"].get("content"):
                    first = time.perf_counter() - started
    assert first is not None, "the call streamed no text"
    return first


@pytest.mark.parametrize("shape", sorted(HOSTILE))
def test_another_tenants_streamed_call_is_not_held_up_by_one_tenants_hostile_calls(system, shape):
    calm, hostile = make_key(system, "calm"), make_key(system, f"hostile-{shape}")
    first_token_s(system.url, calm)  # the model loaded, as it is in service

    attacking, stop, refusals, others = threading.Event(), threading.Event(), [], []
    # No max_tokens: the context is the limit. Encoded once, so that this process spends its
    # time on the calm tenant's call, not on writing JSON.
    body = json.dumps({"model": MODEL, "messages": HOSTILE[shape]}).encode()
    headers = {"Authorization": f"Bearer {hostile}", "Content-Type": "application/json"}

    def keep_calling() -> None:
        with httpx.Client(headers=headers, timeout=300) as client:
            while not stop.is_set():
                if attacking.wait(0.1):
                    code = client.post(f"{system.url}/v1/chat/completions", content=body).status_code
                    (refusals if code == 400 else others).append(code)

    callers = [threading.Thread(target=keep_calling) for _ in range(4)]
    for caller in callers:
        caller.start()
    alone, beside = [], []
    try:
        # Alone and beside in turns, so that the machine's own load (two cores, shared)
        # weighs on both figures alike.
        for _ in range(ROUNDS):
            attacking.clear()
            time.sleep(0.5)  # the calls in flight end
            alone.append(first_token_s(system.url, calm))
            attacking.set()
            time.sleep(1.0)  # the four are in flight
            beside.append(first_token_s(system.url, calm))
    finally:
        stop.set()
        for caller in callers:
            caller.join(300)
    assert others == [] and len(refusals) >= 4  # every hostile call ran, and was refused
    calm_alone, calm_beside = statistics.median(alone), statistics.median(beside)
    assert calm_beside <= calm_alone + SLACK_S, (
        f"first token {calm_beside:.2f} s beside the hostile calls, {calm_alone:.2f} s alone ({beside} / {alone})"
    )
