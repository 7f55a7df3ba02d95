"""A sequence's structured-output constraint: llguidance's token mask on its logits row.

Before a constrained sequence samples, the tokens its grammar does not allow get a logit of
minus infinity in its own row of the step's logits; its sampler chain (penalties, top-k,
temperature, the seeded draw) then runs unchanged on what is left, so the other sequences of
the batch are untouched, and a constrained job is as reproducible as any seeded job. The
grammar is compiled once per job (gpuq/jobs/constraint.py) and copied for each of its ``n``
samples. Measured against llama.cpp's grammar sampler: docs/architecture.md.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import numpy as np

from gpuq.jobs import constraint


class ConstraintBroken(RuntimeError):
    """The grammar left nothing to sample, or refused the sampled token (not expected: the
    mask allows only tokens it accepts); the job fails rather than answer unconstrained."""


class SequenceConstraint(Protocol):
    """What the decoder asks of a sequence's constraint (llguidance's :class:`Constraint`;
    bench/structured.py puts llama.cpp's grammar sampler behind the same verbs to compare)."""

    def fork(self) -> SequenceConstraint: ...

    def masked(self, logits: np.ndarray) -> AbstractContextManager[None]: ...

    def consume(self, token: int) -> None: ...

    @property
    def complete(self) -> bool: ...


class Vocabulary:
    """llguidance's view of one model's tokens, built once per model on first use (about a
    second for a 50,000-token vocabulary) and shared by its sequences."""

    def __init__(self, vocab: Any, n_vocab: int) -> None:
        self._vocab = vocab  # llama_cpp llama_vocab_p
        self.n_vocab = n_vocab
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                from llguidance.llamacpp import lltokenizer_from_vocab

                with warnings.catch_warnings():  # its adapter calls a llama.cpp function deprecated since, per token
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self._tokenizer = lltokenizer_from_vocab(self._vocab, n_vocab=self.n_vocab)
            return self._tokenizer

    def constraint(self, schema: dict[str, Any]) -> Constraint:
        """A sequence's constraint for ``schema`` (compiled here, beside the engine: llguidance
        drops the GIL while it builds)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tokenizer(), constraint.grammar(schema), log_level=0)
        if matcher.is_error():
            raise constraint.UnenforceableSchema(matcher.get_error())
        return Constraint(matcher, self.n_vocab)


class Constraint:
    """One sequence's grammar state: the mask it writes before each sample, the token it
    then consumes."""

    def __init__(self, matcher: Any, n_vocab: int) -> None:
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    def fork(self) -> Constraint:
        """The same state for another sample of the request."""
        return Constraint(self._matcher.deep_copy(), self._n_vocab)

    @contextmanager
    def masked(self, logits: np.ndarray) -> Iterator[None]:
        """Inside, every token the grammar does not allow next has a logit of minus infinity
        in ``logits`` (the row llama.cpp samples from, written in place); after, the row is as
        it was (the samples of one request sample from one row, each with its own grammar)."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self._matcher.is_error():
            raise ConstraintBroken(f"structured output failed: {self._matcher.get_error()}")
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self._n_vocab)
        original = logits.copy()
        np.putmask(logits, allowed == 0, -np.inf)
        try:
            yield
        finally:
            logits[:] = original

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise ConstraintBroken(f"structured output failed: {self._matcher.get_error()}")

    @property
    def complete(self) -> bool:
        """The text is a whole match and nothing can follow it: the sequence ends here."""
        return bool(self._matcher.is_stopped())
