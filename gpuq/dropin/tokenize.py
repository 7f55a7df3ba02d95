"""The tokenizer routes: a model's tokens for a text or a chat, the text of tokens, and what
a remote tokenizer client needs to know (vLLM's ``/tokenize``, ``/detokenize`` and
``/tokenizer_info``, which lm-eval's ``tokenizer_backend=remote`` reads; llama.cpp's server
has the first two under the same names).

Each answers from the vocabulary the API already holds per model file (gpuq/jobs/prompt.py,
no weights), with the same llama.cpp calls the worker makes: a prompt tokenised with the
defaults is exactly what ``/v1/completions`` runs, and messages exactly what
``/v1/chat/completions`` runs, so ``count`` is the ``usage.prompt_tokens`` those report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anyio import to_thread
from sqlalchemy.ext.asyncio import AsyncSession

from gpuq import store
from gpuq.db.tables import Model
from gpuq.dropin.call import find_model
from gpuq.dropin.openai import not_found
from gpuq.errors import RequestError
from gpuq.jobs.prompt import VocabTokenizer, chat_text, out_of_vocabulary, tokenize_prompt
from gpuq.jobs.submit import model_tokenizer


async def resolve_model(db: AsyncSession, name: str | None) -> Model:
    """The named model; without a name (vLLM serves one model, and lm-eval's remote tokenizer
    sends none), the one registered model file, if there is only one."""
    if name is not None:
        return await find_model(db, name, not_found=not_found(name))
    models = list(await db.run_sync(store.list_models))
    if len({m.path for m in models}) == 1:
        return next((m for m in models if m.can_generate), models[0])  # names of one file share its vocabulary
    named = ", ".join(m.name for m in models) or "none"
    raise RequestError(
        400,
        f"`model` is needed: the registered models ({named}) do not all share one file; "
        "name one in the body (or `?model=` on GET /tokenizer_info)",
        param="model",
        code="model_required",
    )


@dataclass(frozen=True, slots=True)
class Tokenized:
    ids: list[int]
    max_model_len: int
    pieces: list[bytes] | None  # each token's bytes, when asked for
    texts: list[str] | None  # each token as the vocabulary spells it, when asked for


def _tokenize(
    tokenizer: VocabTokenizer,
    text: str | None,
    messages: list[dict[str, str]] | None,
    *,
    add_special: bool,
    parse_special: bool,
) -> list[int]:
    if messages is not None:
        text = chat_text(messages, None, tokenizer.formatter)  # ValueError: no chat template
    assert text is not None
    if add_special and parse_special:
        return tokenize_prompt(tokenizer.tokenize, text)  # the worker's own call
    return tokenizer.tokenize(text.encode("utf-8"), add_special, parse_special)


async def tokenize(
    model: Model,
    *,
    text: str | None = None,
    messages: list[dict[str, str]] | None = None,
    add_special: bool = True,
    parse_special: bool = True,
    pieces: bool = False,
    token_texts: bool = False,
) -> Tokenized:
    """``text`` (or ``messages`` rendered with the model's chat template) as the model's token
    ids. ``add_special``: BOS where the vocabulary adds one; ``parse_special``: markers such as
    ``<|im_end|>`` read as their special tokens."""

    def run() -> Tokenized:
        tokenizer = model_tokenizer(model)
        try:
            ids = _tokenize(tokenizer, text, messages, add_special=add_special, parse_special=parse_special)
        except ValueError as exc:
            raise RequestError(400, str(exc), param="messages") from None
        return Tokenized(
            ids,
            model.context_length,
            [tokenizer.piece(i) for i in ids] if pieces else None,
            [tokenizer.token_text(i) for i in ids] if token_texts else None,
        )

    return await to_thread.run_sync(run)


async def detokenize(model: Model, ids: list[int]) -> str:
    """The text of token ids; an id outside the vocabulary is a 400 naming its index."""

    def run() -> str:
        tokenizer = model_tokenizer(model)
        problem = out_of_vocabulary(ids, tokenizer.n_vocab(), "tokens")
        if problem is not None:
            raise RequestError(400, problem, param="tokens", code="invalid_value")
        return tokenizer.detokenize(ids).decode("utf-8", errors="replace")

    return await to_thread.run_sync(run)


def piece_text(piece: bytes) -> str | list[int]:
    """A token's piece as llama.cpp's server writes it: text, or its bytes where they are
    not whole UTF-8 (a token that holds part of a character)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


async def tokenizer_info(model: Model) -> dict[str, Any]:
    """What vLLM's ``GET /tokenizer_info`` gives (the tokenizer's configuration, as Hugging
    Face names its keys), from the GGUF file's vocabulary: the special tokens' texts and ids,
    whether BOS is added, the context length and the chat template."""

    def run() -> dict[str, Any]:
        tokenizer = model_tokenizer(model)
        special = tokenizer.special_tokens()
        metadata = tokenizer.metadata()
        info: dict[str, Any] = {
            "tokenizer_class": f"llama.cpp GGUF ({metadata.get('tokenizer.ggml.model', 'unknown')})",
            "model": model.name,
            "vocab_size": tokenizer.n_vocab(),
            "model_max_length": model.context_length,
            "add_bos_token": tokenizer.adds_bos(),
        }
        for name, token in special.items():
            info[f"{name}_token"] = (
                tokenizer.piece(token).decode("utf-8", errors="replace") if token is not None else None
            )
            info[f"{name}_token_id"] = token
        info["chat_template"] = metadata.get("tokenizer.chat_template") or None
        return info

    return await to_thread.run_sync(run)
