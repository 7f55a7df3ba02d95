"""llama.cpp behind four verbs: load, unload (drop the reference), generate, embed.

Imports ``llama_cpp`` lazily, so ``CUDA_VISIBLE_DEVICES`` set by the worker's launcher is
in place before CUDA is first touched.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from gpuq.jobs.prompt import prompt_text, tokenize_prompt

EMBED_CHUNK = 16  # texts per llama.cpp call (faster than larger ones here); cancellation is checked between chunks


@dataclass(frozen=True, slots=True)
class Generation:
    text: str
    finish_reason: str  # "stop", "length" or "cancelled"
    prompt_tokens: int
    completion_tokens: int


class JobCancelled(Exception):
    """The job was cancelled between two llama.cpp calls."""


class LoadedModel:
    """One llama.cpp model instance, for generation or for embedding (llama.cpp sets the mode
    per context, so a model used both ways is loaded twice; the weights are mmapped once)."""

    def __init__(
        self,
        path: str,
        *,
        n_ctx: int,
        embedding: bool,
        threads: int,
        gpu_layers: int,
        tensor_split: list[float] | None = None,
    ) -> None:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        kwargs: dict[str, Any] = {
            "model_path": path,
            "n_ctx": n_ctx,
            "n_threads": threads,
            "n_threads_batch": threads,
            "n_gpu_layers": gpu_layers,
            "verbose": False,
        }
        if tensor_split:  # a GPU group: layers spread across its GPUs in these proportions
            kwargs["tensor_split"] = tensor_split
        if embedding:
            # Each text must fit one micro-batch for pooled embeddings.
            kwargs |= {
                "embedding": True,
                "pooling_type": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                "n_batch": n_ctx,
                "n_ubatch": n_ctx,
            }
        self.llm = llama_cpp.Llama(**kwargs)
        self.embedding = embedding
        self.formatter = None
        template = self.llm.metadata.get("tokenizer.chat_template")
        if template and not embedding:
            eos, bos = self.llm.token_eos(), self.llm.token_bos()
            self.formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=self.llm._model.token_get_text(eos) if eos != -1 else "",
                bos_token=self.llm._model.token_get_text(bos) if bos != -1 else "",
            )

    def close(self) -> None:
        self.llm.close()

    def generate(self, request: dict[str, Any], cancel: threading.Event) -> Generation:
        import llama_cpp

        tokens = tokenize_prompt(self.llm.tokenize, prompt_text(request, self.formatter))
        # Called once per sampled token: this is where a running job stops when cancelled.
        stopping = llama_cpp.StoppingCriteriaList([lambda _ids, _logits: cancel.is_set()])
        out = self.llm.create_completion(
            prompt=tokens,
            max_tokens=request["max_tokens"],
            temperature=request["temperature"],
            top_p=request["top_p"],
            seed=request.get("seed"),
            stop=request.get("stop") or [],
            stopping_criteria=stopping,
        )
        choice = out["choices"][0]  # type: ignore[index]
        usage = out["usage"]  # type: ignore[index]
        return Generation(
            text=choice["text"],
            finish_reason="cancelled" if cancel.is_set() else (choice["finish_reason"] or "stop"),
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
        )

    def embed(self, texts: list[str], cancel: threading.Event) -> tuple[list[list[float]], int]:
        """Mean-pooled, L2-normalised vectors, and the number of input tokens.

        Repeated texts are embedded once: it saves work, and it makes identical texts get
        identical vectors (llama.cpp's batched maths differs in the last bits by position)."""
        unique = list(dict.fromkeys(texts))
        by_text: dict[str, list[float]] = {}
        tokens = 0
        for start in range(0, len(unique), EMBED_CHUNK):
            if cancel.is_set():
                raise JobCancelled
            chunk = unique[start : start + EMBED_CHUNK]
            out = self.llm.create_embedding(chunk)
            tokens += out["usage"]["prompt_tokens"]
            for text, item in zip(chunk, out["data"], strict=True):
                by_text[text] = _normalise(item["embedding"])  # type: ignore[arg-type]
        return [by_text[text] for text in texts], tokens


def _normalise(vector: list[float]) -> list[float]:
    norm = sum(x * x for x in vector) ** 0.5
    return [x / norm for x in vector] if norm > 0 else vector
