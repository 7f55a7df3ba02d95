"""Turning a generation request into the exact tokens the model will see.

The API tokenises a prompt to refuse one that cannot fit the model's context, and hands
the tokens to the worker with the job (``Counted.ids``), so the count the user is told is
the count that runs and a prompt is tokenised once. Where the API did not tokenise (batch
lines that surely fit), the worker does it the same way: both call :func:`prompt_text` and
llama.cpp's own ``llama_tokenize``. The API loads only the vocabulary (``vocab_only``),
which takes milliseconds and no weights.

Tokenising is the API's one costly step (seconds for a prompt of hundreds of kilobytes), so
a prompt that surely cannot fit is refused without it (:meth:`VocabTokenizer.fewest_tokens`),
and a model's tokenisations run on a small pool of vocabularies, not one behind one lock:
one caller's long prompt does not hold up everyone else's (gpuq/jobs/limits.py also lets
each tenant tokenise one prompt at a time).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

from gpuq.jobs.generation_params import GenerationParams

# Same tokenizer call llama-cpp-python's chat handlers make for a rendered chat prompt.
Tokenize = Callable[[bytes, bool, bool], list[int]]

# Tokenisations of one model that run at once in a process, each on its own copy of the
# vocabulary (a few megabytes): more than one tenant's share (gpuq/jobs/limits.py), so a
# tenant's long prompts leave copies free for the others.
TOKENIZER_POOL_SIZE = 4

# A prompt longer than this many bytes per token of its budget is judged by its start first
# (prose is 3 to 5 bytes a token): most such prompts are refused after a few kilobytes.
START_BYTES_PER_TOKEN = 4
CUT_SLACK = 8  # tokens a cut text may have beyond the whole's over the same stretch


class ChatFormatter(Protocol):
    # list[Any]: llama_cpp types messages and tools as TypedDicts
    def __call__(self, *, messages: list[Any], tools: list[Any] | None = None) -> Any: ...


# For a template that does not render tools (it never reads ``tools``): the tools described in
# a system message, and the plain JSON call gpuq/jobs/tool_calls.py reads back, as llama.cpp's
# server does for such templates.
TOOLS_SYSTEM = (
    "You can call these functions:\n{tools}\nTo call one, answer with only a JSON object: "
    '{{"name": <the function\'s name>, "arguments": <its arguments as a JSON object>}}.'
)


def prompt_text(params: GenerationParams, formatter: ChatFormatter | None) -> str:
    """The prompt string for a generation request: ``prompt`` as given, or ``messages``
    (and ``tools``) rendered with the model's own chat template."""
    messages = params.chat()
    if messages is not None:
        return chat_text(messages, params.tools, formatter)
    if params.prompt is None:
        raise ValueError("the request has no prompt")
    return params.prompt


def chat_text(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, formatter: ChatFormatter | None
) -> str:
    """Chat messages (and tools) rendered with the model's own chat template."""
    if formatter is None:
        raise ValueError("this model has no chat template; send a plain `prompt` instead")
    messages = [_for_template(m) for m in messages]
    tools = tools or None
    if "tool" not in getattr(formatter, "template", "tool"):  # a template that knows no tools
        messages = [_calls_as_text(m) for m in messages]
        if tools:
            messages, tools = _tools_described(messages, tools), None
    return str(formatter(messages=messages, tools=tools).prompt)


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates read it: an assistant's call arguments as a JSON object
    (OpenAI sends them as a JSON string; templates write them with ``tojson``)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    rendered = []
    for call in calls:
        fn = dict(call.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            with contextlib.suppress(ValueError):  # not JSON: written as sent
                fn["arguments"] = json.loads(fn["arguments"])
        rendered.append({**call, "type": call.get("type", "function"), "function": fn})
    return {**message, "tool_calls": rendered}


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant's earlier calls written in its text, in the plain format it was asked for."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    functions = [call["function"] for call in calls]
    written = [json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}) for fn in functions]
    text = "\n".join([message["content"], *written] if message.get("content") else written)
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": text}


def _tools_described(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    listed = "\n".join(json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools)
    described = TOOLS_SYSTEM.format(tools=listed)
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{described}"}, *messages[1:]]
    return [{"role": "system", "content": described}, *messages]


def tokenize_prompt(tokenize: Tokenize, text: str) -> list[int]:
    # add_bos follows the vocabulary's own setting inside llama.cpp; special=True lets
    # chat-template markers such as <|im_start|> become their single special tokens.
    return tokenize(text.encode("utf-8"), True, True)


def request_tokens(params: GenerationParams, tokenize: Tokenize, formatter: ChatFormatter | None) -> list[int]:
    """The tokens a generation runs: ``prompt_token_ids`` as given (no BOS added: the caller
    chose every token), else its text tokenised."""
    if params.prompt_token_ids is not None:
        return list(params.prompt_token_ids)
    return tokenize_prompt(tokenize, prompt_text(params, formatter))


def out_of_vocabulary(ids: list[int], n_vocab: int, what: str) -> str | None:
    """What is wrong with the first id of ``ids`` outside a vocabulary of ``n_vocab`` tokens
    (``what`` names the list as its user wrote it), or None when every id is in it."""
    for i, token in enumerate(ids):
        if not 0 <= token < n_vocab:
            return f"{what}[{i}] is {token}, not a token id of this model (its vocabulary has ids 0 to {n_vocab - 1})"
    return None


def chat_formatter(model: Any) -> ChatFormatter | None:
    """The model's own chat template (GGUF ``tokenizer.chat_template``) as llama-cpp-python
    renders it, or None when the file has none. ``model`` is a llama_cpp ``LlamaModel``."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = model.metadata().get("tokenizer.chat_template")
    if not template:
        return None
    eos, bos = model.token_eos(), model.token_bos()
    return Jinja2ChatFormatter(
        template=template,
        eos_token=model.token_get_text(eos) if eos != -1 else "",
        bos_token=model.token_get_text(bos) if bos != -1 else "",
    )


class VocabTokenizer:
    """A GGUF file's vocabulary and chat template, without its weights."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._file_tag = vocabulary_file_tag(path)  # on the tokens it hands the worker
        self._model = _load_vocabulary(path)
        self._lock = threading.Lock()
        self._skeletons: dict[tuple[str, ...], int] = {}
        self.formatter = chat_formatter(self._model)
        # Copies of the vocabulary for tokenising, made as needed, at most TOKENIZER_POOL_SIZE.
        self._turns = threading.BoundedSemaphore(TOKENIZER_POOL_SIZE)
        self._spare: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._longest_token_bytes: int | None = None

    @contextlib.contextmanager
    def _copy(self) -> Iterator[Any]:
        """A copy of the vocabulary no other thread uses meanwhile (llama.cpp's tokenizer
        keeps per-model caches, so one model object is not shared between threads)."""
        with self._turns:
            try:
                model = self._spare.get_nowait()
            except queue.Empty:
                model = _load_vocabulary(self._path)
            try:
                yield model
            finally:
                self._spare.put(model)

    def metadata(self) -> dict[str, str]:
        """The file's GGUF key-value metadata, as llama.cpp reads it (values as text)."""
        with self._lock:
            return dict(self._model.metadata())

    def n_params(self) -> int:
        with self._lock:
            return int(self._model.n_params())

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
        """llama.cpp's tokens for ``text``, in one call whatever its length (llama-cpp-python
        sizes its buffer by the training context, and tokenises a longer text twice): no text
        has more tokens than bytes, plus the BOS and EOS it may be given."""
        import llama_cpp

        room = len(text) + 2
        buffer = (llama_cpp.llama_token * room)()
        with self._copy() as model:
            n = llama_cpp.llama_tokenize(model.vocab, text, len(text), buffer, room, add_bos, special)
        if n < 0:
            raise ValueError(f"llama.cpp found more than {room} tokens in a text of {len(text)} bytes")
        return buffer[:n]

    def n_vocab(self) -> int:
        with self._lock:
            return int(self._model.n_vocab())

    def detokenize(self, ids: list[int]) -> bytes:
        """The text of ``ids`` as llama.cpp's server gives it: special tokens written out, none
        removed (so tokenising the text again gives the ids back). Every id must be in the
        vocabulary (``out_of_vocabulary``)."""
        import llama_cpp

        tokens = (llama_cpp.llama_token * len(ids))(*ids)
        size = 8 * len(ids) + 16
        with self._lock:
            while True:
                buffer = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_detokenize(self._model.vocab, tokens, len(ids), buffer, size, False, True)
                if n >= 0:
                    return buffer.raw[:n]
                size = -n  # llama.cpp answers a buffer too small with minus the size it needs

    def piece(self, token: int) -> bytes:
        """The bytes one token stands for, as it reads inside a text (its leading space kept;
        a special token's own text, such as <|im_end|>)."""
        import llama_cpp

        size = 64
        with self._lock:
            while True:
                buffer = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_token_to_piece(self._model.vocab, token, buffer, size, 0, True)
                if n >= 0:
                    return buffer.raw[:n]
                size = -n

    def adds_bos(self) -> bool:
        """Whether llama.cpp puts BOS before a text it tokenises (the vocabulary's own setting)."""
        with self._lock:
            return bool(self._model.add_bos_token())

    def token_text(self, token: int) -> str:
        """The token as the vocabulary spells it (``Ġhello`` in a GPT-2 style vocabulary)."""
        with self._lock:
            return str(self._model.token_get_text(token))

    def special_tokens(self) -> dict[str, int | None]:
        """The vocabulary's BOS, EOS, padding and unknown token ids (None where it has none)."""
        import llama_cpp

        with self._lock:
            vocab = self._model.vocab
            found = {
                "bos": llama_cpp.llama_vocab_bos(vocab),
                "eos": llama_cpp.llama_vocab_eos(vocab),
                "pad": llama_cpp.llama_vocab_pad(vocab),
            }
        metadata = self.metadata()
        unk = metadata.get("tokenizer.ggml.unknown_token_id", "")
        found["unk"] = int(unk) if unk.isdigit() else -1
        return {name: token if token >= 0 else None for name, token in found.items()}

    def count(self, text: bytes, add_bos: bool, special: bool) -> int:
        """How many tokens ``tokenize`` would return, without building them: llama.cpp
        answers a zero-sized buffer with minus the count (much faster for the API, which
        counts every line of a 50,000-line batch)."""
        import llama_cpp

        with self._copy() as model:
            n = llama_cpp.llama_tokenize(model.vocab, text, len(text), None, 0, add_bos, special)
        return -n if n < 0 else n

    def longest_token_bytes(self) -> int:
        """The most bytes any one token stands for (special tokens' text included)."""
        if self._longest_token_bytes is None:
            self._longest_token_bytes = max(len(self.piece(t)) for t in range(self.n_vocab()))
        return self._longest_token_bytes

    def fewest_tokens(self, params: GenerationParams) -> int:
        """A lower bound on a generation request's prompt tokens, found without rendering or
        tokenising it: no token stands for more bytes than the vocabulary's longest, and a
        chat template gives every message at least one token (its role's marker). Only the
        contents count, stripped, in case a template trims them."""
        if params.prompt_token_ids is not None:
            return len(params.prompt_token_ids)
        messages = params.messages
        texts = [str(params.prompt)] if messages is None else [m.content for m in messages]
        text_bytes = sum(len(text.strip().encode("utf-8")) for text in texts)
        return max(len(messages or ()), -(-text_bytes // self.longest_token_bytes()))

    def prompt_bytes(self, params: GenerationParams) -> int:
        """The rendered prompt's length in bytes, without rendering it: the chat template is
        rendered once per sequence of roles with empty contents, and the contents' lengths
        added. This assumes the template writes each message's content once, as chat
        templates do; it serves only as a bound on the token count."""
        if params.prompt_token_ids is not None:
            return len(params.prompt_token_ids)
        if params.messages is None:
            return len(str(params.prompt).encode("utf-8"))
        if params.tools or any(m.tool_calls or m.role == "tool" for m in params.messages):
            return len(prompt_text(params, self.formatter).encode("utf-8"))  # rare: rendered whole
        roles = tuple(m.role for m in params.messages)
        skeleton = self._skeletons.get(roles)
        if skeleton is None:
            empty = [{"role": role, "content": ""} for role in roles]
            skeleton = self._skeletons[roles] = len(chat_text(empty, None, self.formatter).encode("utf-8"))
        return skeleton + sum(len(m.content.encode("utf-8")) for m in params.messages)

    def count_request_tokens(self, params: GenerationParams) -> int:
        if params.prompt_token_ids is not None:
            return len(params.prompt_token_ids)
        # The same arguments as tokenize_prompt, so the count is the worker's count.
        return self.count(prompt_text(params, self.formatter).encode("utf-8"), True, True)

    def count_up_to(self, params: GenerationParams, over: int) -> Counted:
        """The prompt's tokens, counted by tokenising it once (the ids go to the worker); or,
        for a long prompt whose start alone has more than ``over`` tokens, a lower bound
        from that start (more than ``over``), without tokenising the rest: a refusal need
        not cost seconds."""
        if params.prompt_token_ids is not None:
            return Counted(len(params.prompt_token_ids), exact=True)  # the request holds them
        text = prompt_text(params, self.formatter).encode("utf-8")
        if len(text) > START_BYTES_PER_TOKEN * over:
            least = self._start_tokens(text, START_BYTES_PER_TOKEN * over)
            if least > over:
                return Counted(least, exact=False)
        ids = self.tokenize(text, True, True)  # the same arguments as tokenize_prompt: the worker's tokens
        return Counted(len(ids), exact=True, ids=pack_prompt_ids(self._file_tag, ids))

    def _start_tokens(self, text: bytes, length: int) -> int:
        """A lower bound on ``text``'s tokens from its first ``length`` bytes or so, cut at a
        space or newline: the start's tokens are the whole's over that stretch, but for the
        few next to the cut (``CUT_SLACK``)."""
        cut = max(text.rfind(b" ", 0, length), text.rfind(b"\n", 0, length))
        if cut <= 0:
            return 0
        return self.count(text[:cut], True, True) - CUT_SLACK

    def count_text_tokens(self, text: str) -> int:
        return self.count(text.encode("utf-8"), True, False)


class Counted(NamedTuple):
    """A prompt's token count. ``exact`` False: a lower bound, found from its start (the
    prompt is too long, so the rest was not tokenised). ``ids``: its tokens, packed for the
    job row, when they were built here."""

    tokens: int
    exact: bool
    ids: bytes | None = None


# Tokens the API built, kept on the job row so the worker runs them without tokenising the
# prompt again: a tag naming the model file they were made with (its name and size, so a
# file registered again under the same model name is never run with another file's ids; the
# worker then tokenises as before), then the ids as 32-bit little-endian integers.
_TAG_BYTES = 8


def vocabulary_file_tag(path: str) -> bytes:
    identity = f"{os.path.basename(path)}\0{os.path.getsize(path)}".encode()
    return hashlib.sha256(identity).digest()[:_TAG_BYTES]


def pack_prompt_ids(tag: bytes, ids: list[int]) -> bytes:
    return tag + struct.pack(f"<{len(ids)}i", *ids)


def unpack_prompt_ids(tag: bytes, packed: bytes | None) -> list[int] | None:
    """The ids packed by the API for the model file tagged ``tag``; None when there are
    none, or they were made with another file."""
    if packed is None or packed[:_TAG_BYTES] != tag:
        return None
    body = packed[_TAG_BYTES:]
    return list(struct.unpack(f"<{len(body) // 4}i", body))


def _load_vocabulary(path: str) -> Any:
    """A GGUF file's vocabulary alone, as a llama_cpp ``LlamaModel`` (milliseconds, no weights)."""
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    return LlamaModel(path_model=path, params=params, verbose=False)


@lru_cache(maxsize=32)
def vocab_tokenizer(path: str) -> VocabTokenizer:
    """One tokenizer per model file per process; they are small and reused for every request."""
    return VocabTokenizer(path)
