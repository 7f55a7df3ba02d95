"""The tokenizer routes' bodies and answers: vLLM's names (what lm-eval's remote tokenizer
sends and reads), llama.cpp's server's names taken too."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.schemas.openai import ChatMessageIn
from gpuq.errors import RequestError

Integer = Annotated[int, Field(strict=True)]
ModelName = Annotated[str, Field(min_length=1, max_length=128)]
_MODEL = "a registered model; may be left out when every registered model is one file"


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: one of ``prompt`` (vLLM), ``content`` (llama.cpp) or ``messages``."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(None, description=_MODEL)
    prompt: str | None = Field(None, description="a text, tokenised as /v1/completions tokenises its prompt")
    content: str | None = Field(None, description="llama.cpp's name for `prompt`")
    messages: list[ChatMessageIn] | None = Field(
        None, min_length=1, description="a chat, rendered with the model's template as /v1/chat/completions does"
    )
    add_special_tokens: bool | None = Field(
        None, description="BOS where the vocabulary adds one (vLLM's name); default true, false for `content`"
    )
    add_special: bool | None = Field(None, description="llama.cpp's name for `add_special_tokens`")
    parse_special: bool = Field(True, description="read markers such as <|im_end|> as their special tokens")
    with_pieces: bool = Field(False, description="llama.cpp's: each token as {id, piece} instead of its id")
    return_token_strs: bool = Field(False, description="vLLM's: each token as the vocabulary spells it, in token_strs")
    add_generation_prompt: bool = Field(True, description="with messages: only true (as chat completions run)")

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if sum(x is not None for x in (self.prompt, self.content, self.messages)) != 1:
            raise ValueError("give exactly one of `prompt` (or llama.cpp's `content`) or `messages`")
        return self

    @property
    def text(self) -> str | None:
        return self.prompt if self.prompt is not None else self.content

    @property
    def adds_special(self) -> bool:
        """vLLM adds special tokens unless told not to; llama.cpp's server (``content``) does not."""
        for given in (self.add_special_tokens, self.add_special):
            if given is not None:
                return given
        return self.content is None

    def chat(self) -> list[dict[str, str]] | None:
        """The messages as the chat template takes them (as chat completions read them)."""
        if self.messages is None:
            return None
        if not self.add_generation_prompt:
            raise RequestError(
                400,
                "add_generation_prompt: false is not supported by gpuq: its chat completions always "
                "end the prompt with the assistant's turn, and /tokenize says what they run",
                param="add_generation_prompt",
                code="unsupported_parameter",
            )
        roles = {"developer": "system"}
        return [{"role": roles.get(m.role, m.role), "content": m.text(i)} for i, m in enumerate(self.messages)]


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int] = Field(description="the token's text; its bytes where they are not whole UTF-8")


class TokenizeResponse(BaseModel):
    """vLLM's answer; ``tokens`` are {id, piece} objects with llama.cpp's ``with_pieces``."""

    tokens: list[int] | list[TokenPiece]
    count: int
    max_model_len: int = Field(description="the model's context in gpuq (its registered context_length)")
    token_strs: list[str] | None = Field(None, description="with return_token_strs")


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(None, description=_MODEL)
    tokens: list[Integer] = Field(description="token ids of the model's vocabulary")


class DetokenizeResponse(BaseModel):
    prompt: str = Field(description="the text (vLLM's name, which lm-eval reads)")
    content: str = Field(description="the same text (llama.cpp's name)")


class TokenizerInfo(BaseModel):
    """vLLM's ``/tokenizer_info``: the tokenizer's configuration under Hugging Face's key names."""

    tokenizer_class: str = Field(description="llama.cpp GGUF (<the file's tokenizer.ggml.model>)")
    model: str
    vocab_size: int
    model_max_length: int = Field(description="the model's context in gpuq")
    add_bos_token: bool = Field(description="whether BOS is put before a tokenised text")
    bos_token: str | None
    bos_token_id: int | None
    eos_token: str | None
    eos_token_id: int | None
    pad_token: str | None
    pad_token_id: int | None
    unk_token: str | None
    unk_token_id: int | None
    chat_template: str | None = Field(description="the GGUF file's Jinja chat template")
