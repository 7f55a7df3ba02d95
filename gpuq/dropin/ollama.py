"""Ollama's wire format (its api/types.go): options in, NDJSON chunks and model lists out.

Durations are nanoseconds, as Ollama reports them: ``total_duration`` from the request's
arrival to its end (queueing included: it is a queue), ``load_duration`` the model load the
job waited for, ``prompt_eval_duration`` from the sequence's admission to its first token,
``eval_duration`` the rest. Like Ollama, figures that are zero or unknown are left out.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from gpuq.batches.openai_choices import token_logprob
from gpuq.db.tables import Model, ModelKind
from gpuq.errors import RequestError
from gpuq.jobs import tool_calls
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.request import MAX_KEEP_ALIVE_S, OLLAMA_DEFAULTS, refusal
from gpuq.streams.events import Delta, End, Event, Start, ended_badly, restarted_mid_answer

NS_PER_MS = 1_000_000
KEEP_FOREVER = -1.0
# Options fixed when a model loads; gpuq's workers load models for the whole fleet by its own settings.
LOAD_OPTIONS = frozenset(
    {"num_batch", "num_gpu", "main_gpu", "use_mmap", "use_mlock", "num_thread", "numa", "low_vram", "f16_kv"}
    | {"vocab_only", "embedding_only", "logits_all", "num_keep", "draft_num_predict"}
)
# GGUF general.file_type -> Ollama's quantization_level names (llama.cpp's LLAMA_FTYPE_*).
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}  # fmt: skip
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def not_found(model: str) -> str:
    return f"model '{model}' not found"


def strip_tag(name: str) -> str:
    """gpuq's models have no tags: ``name:latest`` (what Ollama's tools write) is ``name``."""
    return name.removesuffix(":latest")


def tagged(name: str) -> str:
    """A model as Ollama lists it, with the tag its clients expect (``name:latest``)."""
    return f"{name}:latest"


def refuse(param: str, why: str) -> RequestError:
    return RequestError(400, f"{param} is not supported by gpuq: {why}", param=param)


def keep_alive_seconds(value: object) -> float | None:
    """Ollama's keep_alive (seconds, or a Go duration such as "5m" or "1h30m"; negative keeps
    the model loaded until evicted) as gpuq's seconds (-1: forever). NaN, infinity and
    booleans are refused (``false`` is not 0, as Go's decoder would not read it as one)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RequestError(400, 'keep_alive must be a number of seconds or a duration (say "5m")', param="keep_alive")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)  # "300", "-1": seconds, as a number would be
        except ValueError:
            body = text.lstrip("+-")
            parts = _DURATION.findall(body)
            if not parts or "".join(n + u for n, u in parts) != body:
                raise RequestError(400, f'keep_alive {text!r} is not a duration (say "5m", "1h" or 300)') from None
            value = (-1.0 if text.startswith("-") else 1.0) * sum(float(n) * _UNIT_S[u] for n, u in parts)
    if not math.isfinite(value):
        raise RequestError(400, f"keep_alive {value} is not a finite number of seconds", param="keep_alive")
    if value < 0:
        return KEEP_FOREVER
    return min(float(value), MAX_KEEP_ALIVE_S)


@dataclass(frozen=True, slots=True)
class Options:
    """Ollama's runtime options mapped onto gpuq's generation request."""

    sampling: dict[str, Any]
    num_predict: int | None  # None: until the context is full (Ollama's -1)
    num_ctx: int | None

    @classmethod
    def parse(cls, options: dict[str, Any]) -> Options:
        sampling = dict(OLLAMA_DEFAULTS)
        for name, value in options.items():
            if name not in LOAD_OPTIONS and name not in ("num_predict", "num_ctx") and value is not None:
                _set_option(sampling, name, value)
        if sampling.get("seed") is not None and sampling["seed"] < 0:
            sampling["seed"] = None  # Ollama's -1: a random seed
        num_predict = _number("num_predict", options["num_predict"], int) if "num_predict" in options else None
        num_ctx = _number("num_ctx", options["num_ctx"], int) if options.get("num_ctx") is not None else None
        if num_ctx is not None and num_ctx < 1:
            raise RequestError(400, "options.num_ctx must be at least 1", param="options.num_ctx")
        return cls(sampling, num_predict if num_predict is not None and num_predict > 0 else None, num_ctx)

    def params(
        self, model: Model, prompt: dict[str, Any], keep_alive: float | None
    ) -> tuple[GenerationParams, int | None]:
        """The generation request (``max_tokens`` None: what the context leaves), and the
        context to fit in (None: the model's); a 400 naming the first option out of range."""
        if self.num_ctx is not None and self.num_ctx > model.context_length:
            raise RequestError(
                400,
                f"options.num_ctx is {self.num_ctx} but {model.name!r} is registered with a context of "
                f"{model.context_length} tokens (an admin registers it again with a larger context_length)",
                param="options.num_ctx",
            )
        fields = prompt | self.sampling | {"max_tokens": self.num_predict, "keep_alive": keep_alive}
        try:
            return GenerationParams.model_validate(fields), self.num_ctx
        except ValidationError as exc:
            loc = exc.errors()[0]["loc"]
            option = bool(loc) and (loc[0] in self.sampling or loc[0] == "max_tokens")
            raise refusal(exc, prefix="options." if option else "") from None


def _set_option(sampling: dict[str, Any], name: str, value: Any) -> None:
    if name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
        sampling[name] = _number(name, value, float)
    elif name in ("top_k", "seed"):
        sampling[name] = _number(name, value, int)
    elif name == "stop":
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
            raise RequestError(400, "options.stop: give up to 4 non-empty strings", param="options.stop")
        sampling["stop"] = stops
    elif name in ("repeat_last_n", "typical_p", "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta"):
        if not _is_neutral(name, value):
            raise refuse(f"options.{name}", "the sampler is llama-cpp-python's create_completion chain")
    elif name != "penalize_newline":
        raise refuse(f"options.{name}", "unknown option")


def _number(name: str, value: Any, kind: type) -> Any:
    """A number as Ollama's Go decoder reads one: no booleans, no NaN or infinity (which
    JSON cannot spell, though Python's parser reads them)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(400, f"options.{name} must be a finite number", param=f"options.{name}")
    return kind(value)


def _is_neutral(name: str, value: Any) -> bool:
    neutral = {"repeat_last_n": 64, "typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}
    return name not in neutral or value == neutral[name]


def timestamp() -> str:
    """RFC 3339 in UTC, as Ollama's created_at."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def metrics(end: End, started: float) -> dict[str, int]:
    """Ollama's Metrics, in nanoseconds; ``started`` is the request's time.perf_counter()."""
    figures = {
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": (end.load_ms or 0) * NS_PER_MS,
        # Ollama counts the prompt tokens it evaluated: those reused from the cache were not.
        "prompt_eval_count": (end.prompt_tokens or 0) - (end.cached_tokens or 0),
        "prompt_eval_duration": (end.prompt_ms or 0) * NS_PER_MS,
        "eval_count": end.completion_tokens or 0,
        "eval_duration": (end.eval_ms or 0) * NS_PER_MS,
    }
    return {k: v for k, v in figures.items() if v}


def final(
    model: str,
    end: End,
    started: float,
    *,
    chat: bool,
    text: str = "",
    tools: list[dict[str, Any]] | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The last chunk (or, with its text and log-probabilities, the whole non-streamed answer)."""
    body = {"model": model, "created_at": timestamp(), **content(text, chat, tools), **logprobs_field(logprobs)}
    return body | {"done": True, "done_reason": end.finish_reason or "stop"} | metrics(end, started)


def logprobs_field(entries: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Ollama's ``logprobs``: ``[{token, logprob, bytes, top_logprobs}]``, left out when not asked."""
    return {} if entries is None else {"logprobs": [token_logprob(e) for e in entries]}


def content(text: str, chat: bool, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A chunk's text; with tools offered, the calls read from it as Ollama's
    ``message.tool_calls`` (arguments as an object, as Ollama gives them)."""
    if not chat:
        return {"response": text}
    if tools:
        rest, calls = tool_calls.parse(text, tools)
        if calls:
            return {
                "message": {
                    "role": "assistant",
                    "content": rest or "",
                    "tool_calls": [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls],
                }
            }
    return {"message": {"role": "assistant", "content": text}}


def _line(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


async def stream(
    events: AsyncIterator[Event],
    job_id: str,
    model: str,
    started: float,
    *,
    chat: bool,
    tools: list[dict[str, Any]] | None = None,
) -> AsyncIterator[bytes]:
    """NDJSON: one object per piece of text, then the final one with done and the metrics; an
    ``{"error": ...}`` line if the job did not succeed (the Ollama client raises it). With
    tools offered, the text is held and the last object carries it, or the calls read from it."""
    sent_text = False
    held: list[str] | None = [] if chat and tools else None
    async for event in events:
        if isinstance(event, Start) and held:
            held = []  # nothing of it was sent: the new run's text replaces it
        restarted = restarted_mid_answer(job_id, event, sent_text=sent_text)
        if restarted is not None:
            yield _line({"error": restarted})
            return
        if isinstance(event, Delta) and (event.text or event.logprobs):
            if held is not None:
                held.append(event.text)
                continue
            sent_text = True
            chunk = {"model": model, "created_at": timestamp(), **content(event.text, chat)}
            yield _line(chunk | logprobs_field(event.logprobs) | {"done": False})
        if isinstance(event, End):
            problem = ended_badly(job_id, event)
            text = "".join(held or [])
            answer = final(model, event, started, chat=chat, text=text, tools=tools) if not problem else None
            yield _line(answer or {"error": problem})
            return


# ---------------------------------------------------------------- models: /api/tags, /api/show, /api/ps


def digest(model: Model) -> str:
    """An id for the registered model (Ollama's is its manifest's hash; gpuq hashes the
    registration, not the file, so listing never reads gigabytes)."""
    return hashlib.sha256(f"{model.path}:{model.size_bytes}:{model.created_at.isoformat()}".encode()).hexdigest()


def details(model: Model, metadata: dict[str, str], n_params: int) -> dict[str, Any]:
    file_type = metadata.get("general.file_type", "")
    return {
        "parent_model": "",
        "format": "gguf",
        "family": model.architecture,
        "families": [model.architecture],
        "parameter_size": metadata.get("general.size_label") or _size_label(n_params),
        "quantization_level": FILE_TYPES.get(int(file_type), "unknown") if file_type.isdigit() else "unknown",
    }


def _size_label(n_params: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n_params >= size:
            return f"{n_params / size:.1f}{unit}"
    return str(n_params)


def tag(model: Model, metadata: dict[str, str], n_params: int) -> dict[str, Any]:
    """One model of /api/tags, named as Ollama names it (``name:latest``)."""
    return {
        "name": tagged(model.name),
        "model": tagged(model.name),
        "modified_at": model.created_at.isoformat(),
        "size": model.size_bytes,
        "digest": digest(model),
        "details": details(model, metadata, n_params),
    }


def capabilities(model: Model) -> list[str]:
    kinds = model.kinds
    return [c for c, k in (("completion", ModelKind.GENERATE), ("embedding", ModelKind.EMBED)) if k.value in kinds]


def show(model: Model, metadata: dict[str, str], n_params: int) -> dict[str, Any]:
    """/api/show: the model's details, its chat template and its GGUF metadata (the
    tokenizer's long arrays left out, as Ollama leaves them out unless verbose)."""
    info: dict[str, Any] = {
        k: _typed(v) for k, v in sorted(metadata.items()) if not k.startswith("tokenizer.") and k != "general.file_type"
    }
    info["general.parameter_count"] = n_params
    return {
        "license": metadata.get("general.license", ""),
        # The file's name only: where the server keeps its files is not the caller's business.
        "modelfile": f"# registered in gpuq\nFROM {os.path.basename(model.path)}\n",
        "parameters": f"num_ctx {model.context_length}",
        "template": metadata.get("tokenizer.chat_template", ""),
        "details": details(model, metadata, n_params),
        "model_info": info,
        "capabilities": capabilities(model),
        "modified_at": model.created_at.isoformat(),
    }


def _typed(value: str) -> Any:
    """llama.cpp reads GGUF values as text; numbers are given back as numbers."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def running(
    model: Model, metadata: dict[str, str], n_params: int, *, worker: str, host: str, expires_at: float | None
) -> dict[str, Any]:
    """One loaded model of /api/ps (gpuq adds the worker and host that hold it)."""
    vram = model.vram_mib * 1024 * 1024
    return {
        "name": tagged(model.name),
        "model": tagged(model.name),
        "size": max(vram, model.size_bytes),
        "digest": digest(model),
        "details": details(model, metadata, n_params),
        "expires_at": datetime.fromtimestamp(expires_at, UTC).isoformat() if expires_at is not None else None,
        "size_vram": vram,
        "context_length": model.context_length,
        "worker": worker,
        "host": host,
    }
