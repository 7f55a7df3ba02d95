"""Log-probabilities of tokens, read off a logits row: the model's own distribution.

The values are a log-softmax of the raw logits llama.cpp computed for the row, before any
sampler (temperature, penalties, top-k, a grammar) touched them, as OpenAI and vLLM report
them: what the model thinks of each token, not what the sampler did with it. So a greedy
and a sampled run of the same prompt give the same figures for the same tokens, and an
eval harness scores a choice by the model alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token's log-probability, and the ``top`` most likely tokens at its place (a
    prompt's first token has none: nothing comes before it)."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """In float64, so the figures do not depend on float32 rounding of a 49k-term sum."""
    shifted = logits.astype(np.float64) - float(logits.max())
    return shifted - np.log(np.exp(shifted).sum())


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability under ``logits``, with the ``top`` best alternatives."""
    logp = log_softmax(logits)
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        part = np.argpartition(logp, -top)[-top:]
        ordered = part[np.argsort(-logp[part], kind="stable")]
        best = tuple((int(t), float(logp[t])) for t in ordered)
    return TokenLogprob(int(token), float(logp[token]), best)


def as_json(entry: TokenLogprob, piece: Callable[[int], bytes]) -> dict[str, Any]:
    """A stored entry: OpenAI's chat shape (``token``, ``bytes``, ``logprob``, ``top_logprobs``)
    and the token's ``id``, from which every route's shape is made. ``piece(token)``: its bytes."""
    return {
        **_token(entry.token, entry.logprob, piece),
        "top_logprobs": [_token(t, lp, piece) for t, lp in entry.top],
    }


def _token(token: int, logprob: float | None, piece: Callable[[int], bytes]) -> dict[str, Any]:
    raw = piece(token)
    return {"id": token, "token": raw.decode("utf-8", errors="replace"), "bytes": list(raw), "logprob": logprob}
