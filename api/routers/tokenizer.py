"""/tokenize, /detokenize, /tokenizer_info: a model's tokenizer, as vLLM's server names and
shapes them (llama.cpp's server has the first two), at the server's root where lm-eval's
remote tokenizer calls them (it strips ``/v1/completions`` from its ``base_url``).

They need a key, as every model route does (lm-eval sends it with ``auth_token=<key>`` in its
model_args), and answer from the model's vocabulary in the API: no job, no worker.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from api.deps import CallerDep, SessionDep
from api.errors import errors
from api.schemas.tokenizer import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
    TokenPiece,
)
from gpuq.dropin import tokenize as tokenizer
from gpuq.jobs.limits import tokenising_turn

router = APIRouter(tags=["tokenizer"])

_REFUSED = "no model named while several files are registered, a token id outside the vocabulary, or no chat template"
_ERRORS = errors(404, other={400: {"description": _REFUSED}})


@router.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
async def tokenize(body: TokenizeRequest, db: SessionDep, caller: CallerDep) -> TokenizeResponse:
    """The token ids of `prompt`, or of `messages` rendered with the model's chat template: with
    the defaults, exactly the tokens /v1/completions or /v1/chat/completions would run."""
    model = await tokenizer.resolve_model(db, body.model)
    async with tokenising_turn(caller.owner):  # as a call's prompt is: one at a time per tenant
        done = await tokenizer.tokenize(
            model,
            text=body.text,
            messages=body.chat(),
            add_special=body.adds_special,
            parse_special=body.parse_special,
            pieces=body.with_pieces,
            token_texts=body.return_token_strs,
        )
    tokens: list[int] | list[TokenPiece] = done.ids
    if done.pieces is not None:
        tokens = [TokenPiece(id=i, piece=tokenizer.piece_text(p)) for i, p in zip(done.ids, done.pieces, strict=True)]
    return TokenizeResponse(tokens=tokens, count=len(done.ids), max_model_len=done.max_model_len, token_strs=done.texts)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
async def detokenize(body: DetokenizeRequest, db: SessionDep, _caller: CallerDep) -> DetokenizeResponse:
    """The text of token ids, special tokens written out (tokenising it gives the ids back)."""
    model = await tokenizer.resolve_model(db, body.model)
    text = await tokenizer.detokenize(model, body.tokens)
    return DetokenizeResponse(prompt=text, content=text)


@router.get("/tokenizer_info", response_model=TokenizerInfo, responses=_ERRORS)
async def tokenizer_info(
    db: SessionDep,
    _caller: CallerDep,
    model: Annotated[str | None, Query(min_length=1, max_length=128, description="the model")] = None,
) -> dict[str, Any]:
    """The tokenizer's configuration, as vLLM gives it: special tokens, BOS, context, chat template."""
    return await tokenizer.tokenizer_info(await tokenizer.resolve_model(db, model))
