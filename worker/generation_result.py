"""A finished request's generations as the job row's ``result``, and its pieces as stream deltas.

The row keeps the first sample at the top (``text``, ``finish_reason``: what a one-sample
job has always had) and every sample under ``choices`` when there are several. Log-
probabilities, when the request asked, are stored in OpenAI's chat shape with each token's
id (``logprobs``; ``prompt_logprobs`` with echo); each route's answer is made from them
(gpuq/batches/openai_format.py, gpuq/dropin/ollama.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuq.streams.events import Delta
from worker.decoding import Generation, Piece
from worker.decoding.logprobs import as_json

TokenBytes = Callable[[int], bytes]


def result_of(generations: tuple[Generation, ...], token_bytes: TokenBytes) -> dict[str, Any]:
    first = generations[0]
    result: dict[str, Any] = _sample(first, token_bytes)
    result.pop("index")
    result.pop("completion_tokens")
    if first.prompt_logprobs is not None:
        result["prompt_logprobs"] = [as_json(e, token_bytes) for e in first.prompt_logprobs]
    if len(generations) > 1:
        result["choices"] = [_sample(g, token_bytes) for g in generations]
    return result


def _sample(g: Generation, token_bytes: TokenBytes) -> dict[str, Any]:
    sample: dict[str, Any] = {
        "index": g.index,
        "text": g.text,
        "finish_reason": g.finish_reason,
        "completion_tokens": g.completion_tokens,
    }
    if g.stop_sequence is not None:  # only when one did: rows without it read as before
        sample["stop_sequence"] = g.stop_sequence
    if g.logprobs is not None:
        sample["logprobs"] = [as_json(e, token_bytes) for e in g.logprobs]
    return sample


def delta_of(piece: Piece, token_bytes: TokenBytes) -> Delta:
    logprobs = [as_json(e, token_bytes) for e in piece.logprobs] if piece.logprobs else None
    return Delta(piece.text, piece.tokens, index=piece.index, logprobs=logprobs)
