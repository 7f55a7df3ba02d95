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

from gpuq.jobs.prompt import ChatFormatter, chat_formatter, prompt_text, tokenize_prompt
from gpuq.jobs.request import GenerationParams
from gpuq.streams.events import TOKENS
from worker.decoding import BatchDecoder, DamagedModel, Sampling
from worker.decoding.constraint import Constraint, Vocabulary

EMBED_CHUNK = 16  # texts per llama.cpp call (faster than larger ones here); cancellation is checked between chunks


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
            constraint=self.constraint,
        )


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
    ) -> None:
        self.embedding = embedding
        self.formatter: ChatFormatter | None = None
        self.decoder: BatchDecoder | None = None
        if embedding:
            self.llm = _embedding_llama(path, n_ctx, threads, gpu_layers, tensor_split)
            return
        self.model = _load_weights(path, gpu_layers, tensor_split)
        self.formatter = chat_formatter(self.model)
        self.vocabulary = Vocabulary(self.model.vocab, self.model.n_vocab())
        self.decoder = BatchDecoder(
            self.model, slots=slots, n_ctx_per_seq=n_ctx, threads=threads, prompt_cache=prompt_cache
        )

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.close()
            self.model.close()
        else:
            self.llm.close()

    def prompt_tokens(self, request: dict[str, Any]) -> list[int]:
        return tokenize_prompt(self.model.tokenize, prompt_text(request, self.formatter))

    def prepare(
        self, key: str, request: dict[str, Any], cancel: threading.Event, deadline: float | None = None
    ) -> Prepared:
        """A generation made ready to admit: its prompt tokenised and its output schema, if
        any, compiled (beside the engine: the vocabulary is only read, and llama.cpp's
        tokenizer and llguidance's compiler release the GIL)."""
        assert self.decoder is not None, "an embedding model does not generate"
        params = GenerationParams.model_validate(request)
        schema = params.output_schema
        constraint = self.vocabulary.constraint(schema) if schema is not None else None
        return Prepared(key, params, self.prompt_tokens(request), cancel, deadline, self.decoder, constraint)

    def tokens_decoded(self) -> int:
        assert self.decoder is not None
        return self.decoder.tokens_decoded

    def embed(self, texts: list[str], cancel: threading.Event) -> tuple[list[list[float]], int]:
        """Mean-pooled, L2-normalised vectors, and the number of input tokens (of each distinct text once)."""
        by_text = self.embed_texts(texts, cancel)
        return [by_text[text][0] for text in texts], sum(by_text[text][1] for text in set(texts))

    def embed_texts(self, texts: list[str], cancel: Cancel) -> dict[str, tuple[list[float], int]]:
        """Each distinct text's vector and token count.

        Repeated texts are embedded once: it saves work, and it makes identical texts get
        identical vectors (llama.cpp's batched maths differs in the last bits by position)."""
        unique = list(dict.fromkeys(texts))
        by_text: dict[str, tuple[list[float], int]] = {}
        for start in range(0, len(unique), EMBED_CHUNK):
            if cancel.is_set():
                raise JobCancelled
            chunk = unique[start : start + EMBED_CHUNK]
            out = self.llm.create_embedding(chunk)
            for text, item in zip(chunk, out["data"], strict=True):
                # create_embedding's own tokenisation, so the counts add up to its usage figure.
                tokens = len(self.llm.tokenize(text.encode("utf-8")))
                by_text[text] = (_normalise(item["embedding"]), tokens)
        return by_text


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
