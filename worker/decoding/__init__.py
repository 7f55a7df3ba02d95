"""The engine: requests run as sequences over KV streams, one llama.cpp context per model.

``decoder.py`` (the step loop: plan, decode, commit), ``plan.py`` (a step as data),
``kv_streams.py`` (which prefix each KV stream holds, reuse and moves), ``text.py`` (a
completion's text, token by token, with the end rules), ``logprobs.py`` (tokens'
log-probabilities from a logits row), ``constraint.py`` (structured output: a sequence's
grammar as a mask on its logits row).
"""

from worker.decoding.decoder import (
    DAMAGED_LOGITS,
    FLASH_ATTN_CHUNK_TOKENS,
    PREFILL_CHUNK_TOKENS,
    BatchDecoder,
    DamagedModel,
    DecodeError,
    Finished,
    Generation,
    Piece,
    Sampling,
)
from worker.decoding.logprobs import TokenLogprob

__all__ = [
    "DAMAGED_LOGITS",
    "FLASH_ATTN_CHUNK_TOKENS",
    "PREFILL_CHUNK_TOKENS",
    "BatchDecoder",
    "DamagedModel",
    "DecodeError",
    "Finished",
    "Generation",
    "Piece",
    "Sampling",
    "TokenLogprob",
]
