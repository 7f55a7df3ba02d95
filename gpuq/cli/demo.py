"""`gpuq demo`: the whole path on embedded defaults, from HTTP to llama.cpp and back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from gpuq.cli.client import GpuqClient
from gpuq.local.embedded import embedded_system
from gpuq.local.redis_server import free_port
from gpuq.log_config import only_warnings
from gpuq.registry.bundled import BUNDLED_MODEL_NAME, SECOND_MODEL_NAME, second_model_installed
from gpuq.settings import Settings

# Asked greedily (temperature 0, a fixed seed), so a fresh clone sees the same answers. Worded
# for a 135M model: "What is the capital of France?" greedily answers "L'Étoile, la Marseillaise,
# la femme…"; "Which city is the capital of France?" answers "The capital of France is Paris."
QUESTIONS = [
    ("high", "Which city is the capital of France?"),
    ("normal", "Name three primary colours."),
    ("low", "Write one sentence about the sea."),
]
TEXTS = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Quarterly revenue grew by 12 percent."]


START_TIMEOUT_S = 60.0


@contextmanager
def serve_api(settings: Settings) -> Iterator[str]:
    """The API on a free loopback port in a background thread, for as long as the block runs."""
    import uvicorn

    from api.main import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:  # the first call must not race uvicorn's start (a busy machine is slow)
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the API did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def run_demo(settings: Settings, *, workers: int = 1) -> int:
    started = time.monotonic()
    # With the optional second model installed, it answers the first question too: one worker
    # then swaps between two real models of two architectures. It is a base model with no chat
    # template, so it is asked a plain prompt.
    second = second_model_installed()
    if second:
        settings = settings.model_copy(update={"register_second_model": True})
    chat: dict[str, Any] = {"max_tokens": 48, "temperature": 0.0, "seed": 42}
    asked: list[tuple[str, str, str, dict[str, Any]]] = [
        (BUNDLED_MODEL_NAME, priority, question, chat | {"messages": [{"role": "user", "content": question}]})
        for priority, question in QUESTIONS
    ]
    if second:
        plain: dict[str, Any] = {
            "prompt": f"Q: {QUESTIONS[0][1]}\nA:",
            "stop": ["\n"],
            "max_tokens": 24,
            "temperature": 0.0,
        }
        asked.append((SECOND_MODEL_NAME, "high", QUESTIONS[0][1], plain))
    with only_warnings(), embedded_system(settings, workers=workers) as system, serve_api(system.settings) as url:
        client = GpuqClient(url, api_key=system.api_key)
        client.wait_ready()
        click.echo(f"gpuq is up at {url} (database {system.settings.database_url}, Redis {system.settings.redis_url})")
        jobs = client.submit_many(
            [
                {"kind": "generate", "model": model, "priority": priority} | request
                for model, priority, _question, request in asked
            ]
            + [{"kind": "embed", "model": BUNDLED_MODEL_NAME, "input": TEXTS}]
        )
        click.echo(f"submitted {len(jobs)} jobs; waiting for the worker (the first job loads the model)")
        done = [client.wait(job["id"], timeout_s=300) for job in jobs]
        client.close()
    failures = 0
    for (model, priority, question, _request), job in zip(asked, done[:-1], strict=True):
        click.echo(f"\n[{priority}] {question}" + (f" ({model})" if model != BUNDLED_MODEL_NAME else ""))
        if job["status"] != "succeeded":
            failures += 1
            click.echo(f"  {job['status']}: {job['error']}")
            continue
        click.echo(f"  {job['result']['text'].strip()}")
        click.echo(
            f"  ({job['completion_tokens']} tokens, waited {job['queue_wait_ms']} ms, loaded {job['load_ms']} ms, "
            f"ran {job['run_ms']} ms on {job['device']}, worker {job['worker']})"
        )
    embed = done[-1]
    click.echo("\nembeddings (cosine similarity):")
    if embed["status"] != "succeeded":
        failures += 1
        click.echo(f"  {embed['status']}: {embed['error']}")
    else:
        vectors = embed["result"]["embeddings"]
        for i, text in enumerate(TEXTS):
            sims = "  ".join(f"{sum(a * b for a, b in zip(vectors[i], v, strict=True)):.3f}" for v in vectors)
            click.echo(f"  {sims}   {text}")
    click.echo(f"\ndone in {time.monotonic() - started:.1f} s")
    return 1 if failures else 0
