"""Structured output in a continuous batch: K sequences, each held to its own JSON schema.

The engine alone (``LoadedModel`` and its ``BatchDecoder``, in this process, no queue or
HTTP: those cost the same with or without a schema), K slots, the same chat prompts on
three sides:

* **unconstrained**: the prompts as they are (they ask for JSON; nothing enforces it);
* **llguidance** (what gpuq ships, worker/decoding/constraint.py): each sequence's token mask
  computed from its grammar and written into its logits row before its sampler chain runs;
* **llama.cpp's grammar sampler** (``LlamaGrammar.from_json_schema``, llama-cpp-python's
  schema converter, and ``llama_sampler_init_grammar``), put behind the same verbs: the
  grammar applied to the sequence's full row of candidates, then the same chain.

Aggregate completion tokens/s of each side, and validity: every constrained output that
ended by itself (not cut at ``max_tokens``) checked against its schema with ``jsonschema``.
The schemas vary (nested objects, arrays with bounds, enums, numbers with ranges, patterns,
``$ref``, ``anyOf``, nullable types); the last line is the ratio llguidance / unconstrained.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jsonschema  # a test-extra package
import numpy as np

from gpuq.jobs.generation_params import GenerationParams
from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, require_bundled_model_path
from worker.decoding import Finished, Sampling
from worker.decoding.constraint import SequenceConstraint
from worker.engine import LoadedModel

_NAME = {"type": "string", "minLength": 1, "maxLength": 24}
_SHORT = {"type": "string", "maxLength": 40}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"title": _SHORT, "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
     "genre": {"enum": ["drama", "comedy", "horror", "documentary"]}}, "required": ["title", "year", "genre"]},
    {"type": "object", "properties": {"city": _NAME, "country": _NAME, "population": {"type": "integer", "minimum": 0}},
     "required": ["city", "country", "population"], "additionalProperties": False},
    {"type": "object", "properties": {"fruits": {"type": "array", "items": _NAME, "minItems": 1, "maxItems": 4}},
     "required": ["fruits"], "additionalProperties": False},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000},
     "currency": {"enum": ["EUR", "USD", "GBP"]}, "in_stock": {"type": "boolean"}},
     "required": ["price", "currency", "in_stock"], "additionalProperties": False},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {"first": _NAME, "last": _NAME},
     "required": ["first", "last"], "additionalProperties": False},
     "address": {"type": "object", "properties": {"street": _SHORT, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
     "required": ["street", "zip"], "additionalProperties": False}}, "required": ["person", "address"],
     "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number",
     "minimum": 0, "maximum": 1}}, "required": ["answer", "confidence"], "additionalProperties": False},
    {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "object", "properties":
     {"n": {"type": "integer", "minimum": 1, "maximum": 9}, "text": _SHORT}, "required": ["n", "text"],
     "additionalProperties": False}, "minItems": 1, "maxItems": 3}}, "required": ["steps"],
     "additionalProperties": False},
    {"$defs": {"colour": {"enum": ["red", "green", "blue", "yellow"]}}, "type": "object",
     "properties": {"primary": {"$ref": "#/$defs/colour"}, "secondary": {"$ref": "#/$defs/colour"}},
     "required": ["primary", "secondary"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, _NAME]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"nickname": {"type": ["string", "null"], "maxLength": 16},
     "score": {"type": "integer", "minimum": -10, "maximum": 10}}, "required": ["nickname", "score"],
     "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
     "ok": {"type": "boolean"}}, "required": ["code", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c", "d"]},
     "minItems": 2, "maxItems": 3}, "count": {"type": "integer", "minimum": 2, "maximum": 3}},
     "required": ["tags", "count"], "additionalProperties": False},
    {"type": "object", "properties": {"temperature_c": {"type": "number", "minimum": -50, "maximum": 60},
     "sky": {"enum": ["clear", "cloudy", "rain", "snow"]}}, "required": ["temperature_c", "sky"],
     "additionalProperties": False},
    {"type": "object", "properties": {"language": _NAME, "typed": {"type": "boolean"},
     "first_release": {"type": "integer", "minimum": 1950, "maximum": 2025}},
     "required": ["language", "typed", "first_release"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 6}, "minItems": 3, "maxItems": 5},
    {"type": "object", "properties": {"book": _SHORT, "pages": {"type": "integer", "minimum": 10, "maximum": 2000},
     "rating": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["book", "pages", "rating"],
     "additionalProperties": False},
    {"type": "object", "properties": {"ingredients": {"type": "array", "items": {"type": "object", "properties":
     {"item": _NAME, "grams": {"type": "integer", "minimum": 1, "maximum": 1000}}, "required": ["item", "grams"],
     "additionalProperties": False}, "minItems": 1, "maxItems": 3}}, "required": ["ingredients"],
     "additionalProperties": False},
    {"type": "object", "properties": {"planet": {"enum": ["Mercury", "Venus", "Earth", "Mars", "Jupiter"]},
     "moons": {"type": "integer", "minimum": 0, "maximum": 95}}, "required": ["planet", "moons"],
     "additionalProperties": False},
    {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
     "verified": {"type": "boolean"}}, "required": ["email", "verified"], "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": -1, "maximum": 1},
     "y": {"type": "number", "minimum": -1, "maximum": 1}}, "required": ["x", "y"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"const": "done"}, "items_done": {"type": "integer", "minimum": 0,
     "maximum": 50}}, "required": ["status", "items_done"], "additionalProperties": False},
    {"type": "object", "properties": {"animal": _NAME, "legs": {"enum": [0, 2, 4, 6, 8]}, "wild": {"type": "boolean"}},
     "required": ["animal", "legs", "wild"], "additionalProperties": False},
    {"type": "object", "properties": {"summary": _SHORT, "keywords": {"type": "array", "items": _NAME,
     "maxItems": 3}}, "required": ["summary", "keywords"], "additionalProperties": False},
    {"type": "object", "properties": {"team": _NAME, "players": {"type": "integer", "minimum": 5, "maximum": 11},
     "captain": {"type": "object", "properties": {"name": _NAME, "number": {"type": "integer", "minimum": 1,
     "maximum": 99}}, "required": ["name", "number"], "additionalProperties": False}},
     "required": ["team", "players", "captain"], "additionalProperties": False},
]  # fmt: skip
TOPICS = ["a person", "a film", "a city", "fruit", "a product", "a customer", "a question", "a recipe"]


def jobs(count: int, max_tokens: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``count`` (chat request, schema) pairs: each schema with each topic in turn."""
    pairs = itertools.islice(itertools.cycle(itertools.product(TOPICS, SCHEMAS)), count)
    out = []
    for i, (topic, schema) in enumerate(pairs):
        # Short prompts: the steps are decode steps, where a constraint's cost shows (the schema
        # itself is enforced, not told).
        ask = f"Answer with a JSON value about {topic}."
        request = {"messages": [{"role": "user", "content": ask}], "temperature": 0.7, "top_p": 0.95, "seed": i}
        request["max_tokens"] = max_tokens
        out.append((request, schema))
    return out


class GrammarSampler:
    """llama.cpp's grammar sampler as a :class:`SequenceConstraint`: applied to all the row's
    candidates (llama.cpp's chain does the same when the grammar is its first sampler)."""

    def __init__(self, model: LoadedModel, gbnf: str) -> None:
        import llama_cpp

        self._llama = llama_cpp
        self._gbnf = gbnf
        self._model = model
        self._sampler = llama_cpp.llama_sampler_init_grammar(model.model.vocab, gbnf.encode(), b"root")
        if not self._sampler:
            raise ValueError("llama.cpp could not parse the grammar")
        n_vocab = model.model.n_vocab()
        self._data = np.zeros(n_vocab, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        self._data["id"] = np.arange(n_vocab, dtype=np.int32)
        self._array = llama_cpp.llama_token_data_array(
            data=self._data.ctypes.data_as(llama_cpp.llama_token_data_p), size=n_vocab, selected=-1, sorted=False
        )

    @classmethod
    def of(cls, model: LoadedModel, schema: dict[str, Any]) -> GrammarSampler:
        from llama_cpp.llama_grammar import LlamaGrammar

        return cls(model, LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)._grammar)

    def fork(self) -> SequenceConstraint:
        return GrammarSampler(self._model, self._gbnf)

    @contextmanager
    def masked(self, logits: np.ndarray) -> Iterator[None]:
        self._data["logit"] = logits
        self._array.size, self._array.selected, self._array.sorted = len(logits), -1, False
        self._llama.llama_sampler_apply(self._sampler, ctypes.byref(self._array))
        original = logits.copy()
        logits[:] = self._data["logit"]
        try:
            yield
        finally:
            logits[:] = original

    def consume(self, token: int) -> None:
        self._llama.llama_sampler_accept(self._sampler, token)

    @property
    def complete(self) -> bool:
        return False  # llama.cpp's grammar says no more than "only end-of-text fits now"


@dataclass
class Side:
    name: str
    completion_tokens: int = 0
    seconds: float = 0.0
    compile_seconds: float = 0.0  # schemas to grammars, before the clock (gpuq does it beside the engine)
    finished: int = 0  # ended by themselves (not cut at max_tokens)
    valid: int = 0
    failed: int = 0
    refused: int = 0  # schemas whose grammar could not be built
    invalid_examples: list[str] = field(default_factory=list)
    lengths: dict[str, int] = field(default_factory=dict)  # each job's completion tokens, by key

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0


def run_side(
    model: LoadedModel,
    pairs: list[tuple[dict[str, Any], dict[str, Any]]],
    kind: str,
    *,
    max_tokens: int,
    lengths: dict[str, int] | None = None,
) -> Side:
    """Every job through the decoder, K at a time as slots free up; ``kind`` is
    ``unconstrained``, ``llguidance`` or ``llama.cpp grammar``. With ``lengths`` (another
    side's :attr:`Side.lengths`) each job is cut at the length it had there, so both sides
    decode the same number of tokens for each prompt and pay the same prefills for them."""
    decoder = model.decoder
    assert decoder is not None
    side = Side(kind)
    compiling = time.perf_counter()
    prepared = []
    for i, (r, schema) in enumerate(pairs):
        try:
            made = _made(model, kind, schema)
        except ValueError:  # llama.cpp could not parse the grammar llama-cpp-python wrote for it
            side.refused += 1
            continue
        params = GenerationParams.model_validate(r)
        prepared.append((f"job{i}", model.prompt_tokens(params), params, made, schema))
    side.compile_seconds = time.perf_counter() - compiling
    done: dict[str, Finished] = {}
    pending = list(prepared)
    started = time.perf_counter()
    while pending or decoder.active:
        while pending and decoder.free_slots:
            key, tokens, params, made, _schema = pending.pop(0)
            cut = lengths.get(key, max_tokens) if lengths is not None else max_tokens
            decoder.admit(key, tokens, max_tokens=max(cut, 1), sampling=Sampling.of(params), constraint=made)
        for finished in decoder.step():
            done[finished.key] = finished
    side.seconds = time.perf_counter() - started
    for key, _tokens, _params, _constraint, schema in prepared:
        _score(side, done[key], schema if kind != "unconstrained" else None)
        if (generation := done[key].generation) is not None:
            side.lengths[key] = generation.completion_tokens
    return side


def _made(model: LoadedModel, kind: str, schema: dict[str, Any]) -> SequenceConstraint | None:
    if kind == "llguidance":
        return model.vocabulary.constraint(schema)
    if kind == "llama.cpp grammar":
        return GrammarSampler.of(model, schema)
    return None


def _score(side: Side, finished: Finished, schema: dict[str, Any] | None) -> None:
    """Counts one job's tokens, and whether its text is valid, if it had a schema and ended by itself."""
    generation = finished.generation
    if generation is None:
        side.failed += 1
        return
    side.completion_tokens += generation.completion_tokens
    if schema is None or generation.finish_reason != "stop":
        return
    side.finished += 1
    try:
        jsonschema.validate(json.loads(generation.text), schema)
        side.valid += 1
    except (ValueError, jsonschema.ValidationError) as exc:
        if len(side.invalid_examples) < 3:
            side.invalid_examples.append(f"{generation.text[:80]!r}: {str(exc).splitlines()[0][:100]}")


def load(slots: int, threads: int) -> LoadedModel:
    return LoadedModel(
        str(require_bundled_model_path()),
        n_ctx=BUNDLED_CONTEXT_LENGTH,
        embedding=False,
        threads=threads,
        gpu_layers=0,
        slots=slots,
    )


@dataclass
class Replay:
    """One mechanism's cost a token, and validity, driven by random logits instead of a model."""

    name: str
    seconds: float = 0.0
    tokens: int = 0
    ended: int = 0
    valid: int = 0
    refused: int = 0

    @property
    def ms_per_token(self) -> float:
        return self.seconds / self.tokens * 1000 if self.tokens else 0.0


def replay(model: LoadedModel, pairs: list[tuple[dict[str, Any], dict[str, Any]]], *, max_tokens: int) -> list[Replay]:
    """Each job's schema drives a greedy draw from random logit rows (the same rows for both
    mechanisms): the time of mask, sample and consume a token, with no decode around it, and
    whether what ended is valid. What the model would have said does not matter here; what
    the mechanism lets through does."""
    n_vocab, eos = model.model.n_vocab(), model.model.token_eos()
    out = [Replay("llguidance"), Replay("llama.cpp grammar")]
    for i, (_request, schema) in enumerate(pairs):
        for figures in out:
            rng = np.random.default_rng(i)
            try:
                made = _made(model, figures.name, schema)
            except ValueError:
                figures.refused += 1
                continue
            assert made is not None
            tokens = _replayed(made, rng, n_vocab, eos, max_tokens, figures)
            if tokens is None:
                continue
            figures.ended += 1
            text = model.model.detokenize(tokens, special=False).decode("utf-8", errors="ignore")
            try:
                jsonschema.validate(json.loads(text), schema)
                figures.valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
    return out


def _replayed(
    made: SequenceConstraint, rng: np.random.Generator, n_vocab: int, eos: int, max_tokens: int, figures: Replay
) -> list[int] | None:
    """The tokens drawn until the grammar ended them; None if cut at ``max_tokens``."""
    tokens: list[int] = []
    for _ in range(max_tokens):
        if made.complete:
            return tokens
        row = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
        started = time.perf_counter()
        with made.masked(row):
            token = int(np.argmax(row))
        made.consume(token)
        figures.seconds += time.perf_counter() - started
        figures.tokens += 1
        if token == eos:
            return tokens
        tokens.append(token)
    return None
