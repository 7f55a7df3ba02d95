"""OpenAI's ``choices`` of a finished generation job: one per sample, with log-probabilities
in the shape each endpoint has them.

The worker stores each token's log-probability in the chat shape, with its id
(``worker/generation_result.py``); from it come

- chat's ``logprobs: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}``;
- the legacy completions shape, ``{tokens, token_logprobs, top_logprobs, text_offset}``, with
  ``top_logprobs`` a ``{token: logprob}`` mapping per token and ``text_offset`` each token's
  character offset in the answer's text; with ``echo`` the prompt's tokens come first (the
  first one's log-probability and alternatives ``null``, as OpenAI gives them), and the text
  is the prompt followed by the completion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def samples(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's samples in ``index`` order: ``choices`` when there are several, else the top."""
    if "choices" in result:
        return sorted(result["choices"], key=lambda c: c["index"])
    return [{"index": 0, **{k: v for k, v in result.items() if k in ("text", "finish_reason", "logprobs")}}]


def chat_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    if entries is None:
        return None
    return {"content": [token_logprob(e) for e in entries], "refusal": None}


def token_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """A token's entry as OpenAI's chat and Ollama both give it: ``token``, ``logprob``,
    ``bytes``, ``top_logprobs`` (the stored entry less its token id)."""
    return {
        "token": entry["token"],
        "logprob": entry["logprob"],
        "bytes": entry["bytes"],
        "top_logprobs": [
            {"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]} for t in entry["top_logprobs"]
        ],
    }


def legacy_logprobs(entries: list[dict[str, Any]], *, offset: int = 0) -> dict[str, Any]:
    """The completions shape; ``offset``: where the first token's text starts in the answer."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for entry in entries:
        tokens.append(entry["token"])
        token_logprobs.append(entry["logprob"])
        top = entry["top_logprobs"]
        top_logprobs.append({t["token"]: t["logprob"] for t in top} if entry["logprob"] is not None else None)
        text_offset.append(offset)
        offset += len(entry["token"])
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def echoed_prompt(request: dict[str, Any], result: dict[str, Any]) -> str:
    """The prompt as the answer repeats it: as given, or its tokens' text (a token-id prompt)."""
    if isinstance(request.get("prompt"), str):
        return str(request["prompt"])
    return "".join(e["token"] for e in result.get("prompt_logprobs") or [])


Message = Callable[[str, str], tuple[dict[str, Any], str]]


def choices(request: dict[str, Any], result: dict[str, Any], *, chat: bool, message: Message) -> list[dict[str, Any]]:
    """Every sample as OpenAI's choice object: chat's (``message(text, finish_reason)`` gives
    its assistant message and finish reason: tool calls read from the text), or completions'."""
    wants_logprobs = request.get("logprobs") is not None
    out = []
    for sample in samples(result):
        finish = sample.get("finish_reason", "stop")
        text = sample.get("text", "")
        if chat:
            assistant, finish = message(text, finish)
            out.append(
                {
                    "index": sample["index"],
                    "message": assistant,
                    "logprobs": chat_logprobs(sample.get("logprobs")) if wants_logprobs else None,
                    "finish_reason": finish,
                }
            )
            continue
        prompt = echoed_prompt(request, result) if request.get("echo") else ""
        logprobs = None
        if wants_logprobs:
            entries = (
                [*(result.get("prompt_logprobs") or []), *sample.get("logprobs", [])]
                if prompt
                else sample.get("logprobs", [])
            )
            logprobs = legacy_logprobs(entries, offset=0 if prompt else len(_prompt_text(request)))
        out.append({"index": sample["index"], "text": prompt + text, "logprobs": logprobs, "finish_reason": finish})
    return out


def _prompt_text(request: dict[str, Any]) -> str:
    prompt = request.get("prompt")
    return prompt if isinstance(prompt, str) else ""
