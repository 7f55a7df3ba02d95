"""A sequence's sampler chain: ``Llama.create_completion``'s own, one per sequence.

Each sequence has its own chain (penalties, top-k, typical, top-p, min-p, temperature, a
seeded draw; greedy at temperature 0), so its tokens do not depend on what else decodes:
the i-th sample of a seeded request is seeded ``seed + i``, and gives the text a one-sample
request seeded so gives.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from gpuq.jobs.generation_params import GenerationParams

PENALTY_LAST_N = 64  # Llama's last_n_tokens_size: the window the repeat penalty looks at


@dataclass(frozen=True, slots=True)
class Sampling:
    """The knobs of create_completion's sampler chain that gpuq exposes. No defaults here:
    they live once, with their reasons, in ``GenerationParams`` (gpuq/jobs/request.py)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repeat_penalty: float
    frequency_penalty: float
    presence_penalty: float
    seed: int | None

    @classmethod
    def of(cls, params: GenerationParams) -> Sampling:
        return cls(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            repeat_penalty=params.repeat_penalty,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            seed=params.seed,
        )


def sampler_chain(sampling: Sampling, index: int, n_vocab: int) -> Any:
    """The chain create_completion builds (Llama._init_sampler) for the ``index``-th sample."""
    from llama_cpp._internals import LlamaSampler

    seed = (sampling.seed + index) % 2**32 if sampling.seed is not None else secrets.randbelow(2**32)
    sampler = LlamaSampler()
    sampler.add_penalties(
        n_vocab,
        PENALTY_LAST_N,
        sampling.repeat_penalty,
        sampling.frequency_penalty,
        sampling.presence_penalty,
    )
    if sampling.temperature < 0:
        sampler.add_dist(seed)
    elif sampling.temperature == 0:
        sampler.add_greedy()
    else:
        sampler.add_top_k(sampling.top_k)
        sampler.add_typical(1.0, 1)
        sampler.add_top_p(sampling.top_p, 1)
        sampler.add_min_p(sampling.min_p, 1)
        sampler.add_temp(sampling.temperature)
        sampler.add_dist(seed)
    return sampler
