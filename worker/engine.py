"""llama.cpp behind a few verbs: load, close, prepare a generation (for the decoder), embed.

Imports ``llama_cpp`` lazily, so ``CUDA_VISIBLE_DEVICES`` set by the worker's launcher is
in place before CUDA is first touched.
"""

from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.prompt import ChatFormatter, chat_formatter, request_tokens, unpack_prompt_ids, vocabulary_file_tag
from gpuq.prefix_blocks import cache_scope, model_fingerprint, namespace_salt
from gpuq.streams.events import TOKENS
from worker.decoding import BatchDecoder, DamagedModel, Sampling
from worker.decoding.constraint import Constraint, Vocabulary
from worker.prefix_cache import PrefixCache

EMBED_CHUNK = 16  # inputs per llama.cpp call (faster than larger ones here); cancellation is checked between chunks

# An embedding input as a job's request holds it (a text, or token ids), and as a key of the
# vectors computed for it (token ids as a tuple).
EmbedInput = str | list[int]
EmbedKey = str | tuple[int, ...]


def embed_key(item: EmbedInput) -> EmbedKey:
    return item if isinstance(item, str) else tuple(item)


class Cancel(Protocol):
    def is_set(self) -> bool: ...


class JobCancelled(Exception):
    """The job was cancelled between two llama.cpp calls."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A generation ready for the decoder: what ``BatchDecoder.admit`` takes, in memory."""

    key: str
    params: GenerationParams
    tokens: list[int]
    cancel: threading.Event
    deadline: float | None
    decoder: BatchDecoder
    constraint: Constraint | None = None
    scope: bytes = b""  # its cache scope: the model file and the tenant (gpuq.prefix_blocks)
    priority: int = 1  # its job's (gpuq.queue_names.Priority): who is parked for whom

    @property
    def n(self) -> int:
        """Samples wanted: the slots it takes."""
        return self.params.n

    def admit(self) -> int:
        """Into the decoder's free slots (ValueError: it cannot run there); returns the prompt
        tokens it took from the cache."""
        params = self.params
        return self.decoder.admit(
            self.key,
            self.tokens,
            max_tokens=params.max_new_tokens,
            sampling=Sampling.of(params),
            stop=params.stop,
            cancel=self.cancel,
            deadline=self.deadline,
            stream=params.events == TOKENS,
            n=params.n,
            # echo needs the prompt's tokens back (a token-id prompt has no text to repeat): they
            # come with log-probabilities, shown only if asked.
            logprobs=0 if params.logprobs is None and params.echo else params.logprobs,
            echo=params.echo,
            constraint=self.constraint,
            scope=self.scope,
            priority=self.priority,
        )


# Where reusing any common prefix (not whole chunks only) was measured exact on the CPU: a
# row's result the same whatever the length of the pass it was computed in. True of SmolLM2
# (llama); not of Gemma 3 (5 of 22 greedy and seeded texts changed from the cache; whole
# chunks gave all 22: tests/worker/test_two_architectures.py). Elsewhere, whole chunks.
ANY_PREFIX_EXACT_ARCHITECTURES = frozenset({"llama"})


def reuses_any_prefix(architecture: str, gpu_layers: int) -> bool:
    """``GPUQ_WORKER_PROMPT_REUSE=auto``: any common prefix on the CPU where it is exact, whole
    chunks on a GPU (kernels picked by a pass's shape) and for other architectures."""
    return gpu_layers == 0 and architecture in ANY_PREFIX_EXACT_ARCHITECTURES


class LoadedModel:
    """One model loaded for generation or for embedding (llama.cpp sets the mode per context,
    so a model used both ways is loaded twice; the weights are mmapped once).

    For generation the weights get a :class:`BatchDecoder` context with ``slots`` sequences
    (continuous batching); for embeddings, llama-cpp-python's ``Llama`` in embedding mode."""

    def __init__(
        self,
        path: str,
        *,
        n_ctx: int,
        embedding: bool,
        threads: int,
        gpu_layers: int,
        tensor_split: list[float] | None = None,
        slots: int = 1,
        prompt_cache: bool = True,
        flash_attn: bool = True,
        any_prefix: bool | None = None,
        prefix_cache: PrefixCache | None = None,
        shared_tenants: bool = False,
        strict_priority: bool | None = None,
    ) -> None:
        self.embedding = embedding
        self.formatter: ChatFormatter | None = None
        self.decoder: BatchDecoder | None = None
        if embedding:
            self.llm = _embedding_llama(path, n_ctx, threads, gpu_layers, tensor_split)
            return
        self.model = _load_weights(path, gpu_layers, tensor_split)
        self.file_tag = vocabulary_file_tag(path)  # which API-built prompt ids fit this model
        self.formatter = chat_formatter(self.model)
        self.vocabulary = Vocabulary(self.model.vocab, self.model.n_vocab())
        self.fingerprint = model_fingerprint(path)  # the cache scope's model part, as every host reads it
        self.shared_tenants = shared_tenants
        self.decoder = BatchDecoder(
            self.model,
            slots=slots,
            n_ctx_per_seq=n_ctx,
            threads=threads,
            prompt_cache=prompt_cache,
            flash_attn=flash_attn,
            any_prefix=reuses_any_prefix(self.model.metadata().get("general.architecture", ""), gpu_layers)
            if any_prefix is None
            else any_prefix,
            prefix_cache=prefix_cache,
            gpu_layers=gpu_layers,
            # On the CPU a step's cost grows with its rows: an urgent sequence decodes alone.
            strict_priority=gpu_layers == 0 if strict_priority is None else strict_priority,
        )

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.close()
            self.model.close()
        else:
            self.llm.close()

    def prompt_tokens(self, params: GenerationParams) -> list[int]:
        return request_tokens(params, self.model.tokenize, self.formatter)

    def prepare(
        self,
        key: str,
        params: GenerationParams,
        cancel: threading.Event,
        deadline: float | None = None,
        prompt_ids: bytes | None = None,
        owner: str | None = None,
        priority: int = 1,
    ) -> Prepared:
        """A generation made ready to admit: its prompt's tokens (those the API built, when it
        built them with this model's file; else tokenised here), its output schema, if any,
        compiled (beside the engine: the vocabulary is only read, and llama.cpp's tokenizer
        and llguidance's compiler release the GIL), and its cache scope: the tenant ``owner``'s
        own, unless this model's cache is shared. ``priority``: the job's, for parking.
        ``params`` are not validated again: the API did (gpuq/jobs/request.py)."""
        assert self.decoder is not None, "an embedding model does not generate"
        schema = params.output_schema
        constraint = self.vocabulary.constraint(schema) if schema is not None else None
        tokens = unpack_prompt_ids(self.file_tag, prompt_ids)
        if tokens is None:
            tokens = self.prompt_tokens(params)
        scope = namespace_salt(self.fingerprint, cache_scope(owner, shared=self.shared_tenants))
        return Prepared(key, params, tokens, cancel, deadline, self.decoder, constraint, scope, priority)

    def tokens_decoded(self) -> int:
        assert self.decoder is not None
        return self.decoder.tokens_decoded

    def embed(self, inputs: list[EmbedInput], cancel: threading.Event) -> tuple[list[list[float]], int]:
        """Mean-pooled, L2-normalised vectors, and the number of input tokens (of each distinct input once)."""
        by_key = self.embed_inputs(inputs, cancel)
        keys = [embed_key(item) for item in inputs]
        return [by_key[key][0] for key in keys], sum(by_key[key][1] for key in set(keys))

    def embed_inputs(self, inputs: list[EmbedInput], cancel: Cancel) -> dict[EmbedKey, tuple[list[float], int]]:
        """Each distinct input's vector and token count. A text is tokenised as llama-cpp-python's
        ``create_embedding`` does it; token ids are run as given.

        Repeated inputs are embedded once: it saves work, and it makes identical inputs get
        identical vectors (llama.cpp's batched maths differs in the last bits by position)."""
        unique = list(dict.fromkeys(embed_key(item) for item in inputs))
        by_key: dict[EmbedKey, tuple[list[float], int]] = {}
        for start in range(0, len(unique), EMBED_CHUNK):
            if cancel.is_set():
                raise JobCancelled
            chunk = unique[start : start + EMBED_CHUNK]
            tokens = [self.llm.tokenize(key.encode("utf-8")) if isinstance(key, str) else list(key) for key in chunk]
            for key, ids, vector in zip(chunk, tokens, _pooled_vectors(self.llm, tokens), strict=True):
                by_key[key] = (_normalise(vector), len(ids))
        return by_key


def _pooled_vectors(llm: Any, sequences: list[list[int]]) -> list[list[float]]:
    """One pooled vector per token sequence: llama-cpp-python's ``Llama.embed`` for token ids
    (it takes only text). Sequences are packed into one llama.cpp batch while they fit (its
    n_batch tokens and n_seq_max sequences), each batch decoded from an empty cache."""
    import llama_cpp

    n_batch, n_seq_max, n_embd = llm.n_batch, llm.context_params.n_seq_max, llm.n_embd()
    batch, ctx = llm._batch, llm._ctx
    vectors: list[list[float]] = []

    def decode(sequences_in_batch: int) -> None:
        ctx.kv_cache_clear()
        ctx.decode(batch)
        batch.reset()
        for seq_id in range(sequences_in_batch):
            vectors.append(llama_cpp.llama_get_embeddings_seq(ctx.ctx, seq_id)[:n_embd])

    batch.reset()
    packed = packed_tokens = 0
    for tokens in sequences:
        if len(tokens) > n_batch:  # the API refuses these; a row from elsewhere fails here, not in llama.cpp
            raise ValueError(f"an input of {len(tokens)} tokens is longer than the context ({n_batch})")
        if packed and (packed_tokens + len(tokens) > n_batch or packed >= n_seq_max):
            decode(packed)
            packed = packed_tokens = 0
        batch.add_sequence(tokens, packed, True)  # every token an output, as Llama.embed marks them
        packed, packed_tokens = packed + 1, packed_tokens + len(tokens)
    if packed:
        decode(packed)
    ctx.kv_cache_clear()
    return vectors


def _normalise(vector: list[float]) -> list[float]:
    if not all(math.isfinite(x) for x in vector):
        raise DamagedModel("the model produced a non-finite embedding (NaN or infinity): its weights are damaged")
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


def _load_weights(path: str, gpu_layers: int, tensor_split: list[float] | None) -> Any:
    """The model's weights (llama.cpp's ``llama_model``), offloaded as asked; contexts come apart."""
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = gpu_layers
    if tensor_split:  # a GPU group: layers spread across its GPUs in these proportions
        split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*tensor_split)
        params.tensor_split = split
    return LlamaModel(path_model=path, params=params, verbose=False)  # it keeps params (and the split) alive


def _embedding_llama(path: str, n_ctx: int, threads: int, gpu_layers: int, tensor_split: list[float] | None) -> Any:
    import llama_cpp

    kwargs: dict[str, Any] = {
        "model_path": path,
        "n_ctx": n_ctx,
        "n_threads": threads,
        "n_threads_batch": threads,
        "n_gpu_layers": gpu_layers,
        "verbose": False,
        "embedding": True,
        "pooling_type": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        # Each text must fit one micro-batch for pooled embeddings.
        "n_batch": n_ctx,
        "n_ubatch": n_ctx,
    }
    if tensor_split:
        kwargs["tensor_split"] = tensor_split
    return llama_cpp.Llama(**kwargs)
