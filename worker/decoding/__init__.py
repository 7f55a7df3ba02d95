"""The engine: requests run as sequences over KV streams, one llama.cpp context per model.

``decoder.py`` (the step loop: admission, then plan, run, commit), ``plan.py`` (a step as
data: rows, prompt chunks, throwaway rows, batches), ``batch_runner.py`` (the llama.cpp
context: one planned batch decoded, a step output back), ``commit.py`` (sequences advanced
from a step output: sampling, text, endings, forks), ``sequences.py`` (requests and their
sequences, each in an explicit state), ``kv_streams.py`` (the one map of which sequence
holds which stream; which prefix each stream holds, reuse and moves), ``sampler.py`` (a
sequence's sampler chain), ``text.py`` (a completion's text, token by token, with the end
rules), ``token_pieces.py`` (a token's bytes, for both threads), ``logprobs.py`` (tokens'
log-probabilities from a logits row), ``constraint.py`` (structured output: a sequence's
grammar as a mask on its logits row), ``results.py`` (what leaves the decoder), ``kv_state.py``
(a stream's cells as bytes and back), ``prefix_tier.py`` (starts saved to and restored from the
prefix cache), ``parking.py`` (sequences parked for more urgent requests, and resumed).
"""

from worker.decoding.batch_runner import DecodeError
from worker.decoding.decoder import FLASH_ATTN_CHUNK_TOKENS, PREFILL_CHUNK_TOKENS, BatchDecoder
from worker.decoding.logprobs import TokenLogprob
from worker.decoding.results import DAMAGED_LOGITS, DamagedModel, Finished, Generation, Piece
from worker.decoding.sampler import Sampling

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
