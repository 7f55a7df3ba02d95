"""Accepting jobs: validate, write the SQL rows, enqueue, in that order.

Order matters. The row is committed before the Redis entry exists, so a worker never
dequeues a job it cannot find. If the enqueue then fails, the rows are deleted and the
caller gets an error; if even that delete fails (the database went away between the
two steps), the reconciler finds the queued rows with no Redis entry and enqueues them.
Either way no row is left ``queued`` forever and no job is lost.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from anyio import to_thread
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpuq import store
from gpuq.auth.access import Caller
from gpuq.db.tables import Job, JobKind, Model
from gpuq.errors import RequestError, queue_unavailable
from gpuq.fleet.placement import can_ever_run, evaluate, explain_unplaceable, group_for
from gpuq.fleet.sample_limit import SampleLimit
from gpuq.fleet.snapshot import Fleet, load_fleet, request_of
from gpuq.fleet.workers import live_workers
from gpuq.jobs.admission import Planned, refuse_late_jobs
from gpuq.jobs.enqueue import enqueue_jobs
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.limits import admit, precheck, tokenising_turn
from gpuq.jobs.prefix_routing import OFF, PrefixRouting, place, prefix_chain
from gpuq.jobs.prompt import (
    Counted,
    VocabTokenizer,
    out_of_vocabulary,
    unpack_prompt_ids,
    vocab_tokenizer,
    vocabulary_file_tag,
)
from gpuq.jobs.request import EmbeddingParams, JobParams
from gpuq.queue_names import Priority, QueueEntry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job as the user asked for it, already checked for shape (types, ranges): its
    request typed as its producer built it (a ``GenerationParams`` for a generation, an
    ``EmbeddingParams`` for an embedding, a bare ``JobParams`` for a noop)."""

    kind: JobKind
    model: str
    priority: Priority
    params: JobParams
    idempotency_key: str | None = None
    # The prompt's tokens when the caller counted them already (a drop-in call sizing its
    # max_tokens): a prompt is tokenised once per call.
    counted: Counted | None = field(default=None, compare=False)
    deadline: datetime | None = None  # when it is needed by (gpuq/jobs/admission.py)

    @property
    def request(self) -> dict[str, Any]:
        """The request as its job row stores it."""
        return self.params.stored()

    @property
    def generation(self) -> GenerationParams:
        if not isinstance(self.params, GenerationParams):
            raise TypeError(f"a {self.kind.value} job's request is not a generation's")
        return self.params

    @property
    def embedding(self) -> EmbeddingParams:
        if not isinstance(self.params, EmbeddingParams):
            raise TypeError(f"a {self.kind.value} job's request is not an embedding's")
        return self.params

    @property
    def request_hash(self) -> str:
        parts: list[Any] = [self.kind.value, self.model, self.priority, self.request]
        if self.deadline is not None:  # the hashes of jobs without one stay as they were
            parts.append(self.deadline.isoformat())
        canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Accepted:
    job: Job
    created: bool  # False when an idempotency key returned an earlier job


def _where(index: int | None) -> str:
    return "" if index is None else f"jobs[{index}]: "


def check_against_model(
    spec: JobSpec, model: Model | None, index: int | None = None, *, exact: bool = True
) -> Counted | None:
    """Checks that need the model: it exists, it does this kind, the input fits its context.
    Returns the prompt's tokens for generation jobs. With ``exact=False`` (batch lines)
    text that surely fits is not tokenised, and None is returned."""
    where = _where(index)
    if model is None:
        raise RequestError(
            404,
            f"{where}model {spec.model!r} is not registered (`gpuq models` or GET /v1/models lists those that are)",
            param="model",
            code="model_not_found",
        )
    if not model.supports(spec.kind):
        raise RequestError(
            422, f"{where}model {model.name!r} cannot run {spec.kind.value} jobs; it is for: {', '.join(model.kinds)}"
        )
    if spec.kind == JobKind.GENERATE:
        return _check_prompt(spec, model, where, exact)
    if spec.kind == JobKind.EMBED:
        _check_texts(spec, model, where, exact)
    return None


def _check_prompt(spec: JobSpec, model: Model, where: str, exact: bool) -> Counted | None:
    params = spec.generation
    n_ctx, max_tokens = model.context_length, params.max_new_tokens
    if max_tokens > n_ctx:
        raise RequestError(
            422,
            f"{where}max_tokens is {max_tokens} but {model.name!r} has a context of {n_ctx} tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    tokenizer = model_tokenizer(model)
    if params.prompt_token_ids is not None:
        _check_ids(params.prompt_token_ids, tokenizer, where, "prompt", param="prompt")
    refuse_surely_too_long(tokenizer, params, max_tokens, n_ctx, model.name, where=where)
    try:
        if not exact and tokenizer.prompt_bytes(params) + 2 <= n_ctx - max_tokens:
            return None  # no tokenizer yields more tokens than bytes (plus BOS/EOS): it fits
        counted = spec.counted or tokenizer.count_up_to(params, n_ctx - max_tokens)
    except ValueError as exc:
        raise RequestError(422, f"{where}{exc}") from None
    if counted.tokens + max_tokens > n_ctx:
        told = f"{counted.tokens}" if counted.exact else f"at least {counted.tokens}"
        raise RequestError(
            422,
            f"{where}the prompt is {told} tokens and max_tokens is {max_tokens}, "
            f"{counted.tokens + max_tokens} in all, but {model.name!r} has a context of {n_ctx} tokens: "
            "shorten the prompt or lower max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return counted


def refuse_surely_too_long(
    tokenizer: VocabTokenizer, params: GenerationParams, max_tokens: int, n_ctx: int, model: str, *, where: str = ""
) -> None:
    """A 422 for a prompt that cannot fit even at the fewest tokens its size allows, found
    without tokenising it (seconds for a few hundred kilobytes; gpuq/jobs/prompt.py)."""
    if params.prompt_token_ids is not None:
        return  # counted exactly, at no cost, where they are checked
    least = tokenizer.fewest_tokens(params)
    if least + max_tokens > n_ctx:
        raise RequestError(
            422,
            f"{where}the prompt is at least {least} tokens (judged by its size, before counting them) and "
            f"max_tokens is {max_tokens}, but {model!r} has a context of {n_ctx} tokens: "
            "shorten the prompt or lower max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )


def _check_texts(spec: JobSpec, model: Model, where: str, exact: bool) -> None:
    n_ctx = model.context_length
    tokenizer = model_tokenizer(model)
    for i, item in enumerate(spec.embedding.input):
        if isinstance(item, list):
            _check_ids(item, tokenizer, where, f"input[{i}]", param="input")
            n = len(item)
        elif not exact and _surely_fits(item, n_ctx):
            continue
        else:
            n = tokenizer.count_text_tokens(item)
        if n > n_ctx:
            raise RequestError(
                422,
                f"{where}input[{i}] is {n} tokens but {model.name!r} embeds at most {n_ctx}: split the text",
                param="input",
            )


def _check_ids(ids: list[int], tokenizer: VocabTokenizer, where: str, what: str, *, param: str) -> None:
    problem = out_of_vocabulary(ids, tokenizer.n_vocab(), what)
    if problem is not None:
        raise RequestError(422, f"{where}{problem}", param=param, code="invalid_value")


def _surely_fits(text: str, budget_tokens: int) -> bool:
    """No tokenizer gives more tokens than bytes, plus the BOS/EOS it may add: a text of
    fewer bytes than the budget fits without being tokenised."""
    return len(text.encode("utf-8")) + 2 <= budget_tokens


def check_placeable(spec: JobSpec, model: Model | None, fleet: Fleet, index: int | None = None) -> None:
    """Refuse a job no GPU (or GPU group) may or can ever run, instead of letting it wait
    forever. A fleet with no GPUs registered runs everything on CPU workers; noop jobs need
    no GPU."""
    if not fleet.gpus or model is None or spec.kind == JobKind.NOOP:
        return
    request = request_of(model, spec.kind.value)
    verdicts = evaluate(request, fleet.gpus, can_ever_run(fleet.rules))
    if not any(v.ok for v in verdicts) and not group_for(request, fleet.gpus, fleet.rules):
        raise RequestError(422, _where(index) + explain_unplaceable(request, verdicts))


def check_samples(spec: JobSpec, limit: SampleLimit, index: int | None = None) -> None:
    """Refuse a generation that asks for more samples than any worker serving its model
    decodes at once (gpuq/fleet/sample_limit.py): no worker could run it."""
    if spec.kind != JobKind.GENERATE or spec.generation.n == 1:
        return
    n = spec.generation.n
    most, live = limit.most(spec.model)
    if n <= most:
        return
    has = (
        f"the live workers serving {spec.model!r} decode at most {most} at once"
        if live
        else f"no worker serving {spec.model!r} is live, and workers start with {most} slots"
    )
    raise RequestError(
        422,
        f"{_where(index)}n is {n}, but a job's samples decode side by side on one worker, one slot each, and {has} "
        f"(GPUQ_WORKER_SLOTS): ask for at most {most} samples, or send several requests",
        param="n",
        code="invalid_value",
    )


async def _read_sample_limit(redis: Redis, fleet: Fleet, *, worker_slots: int) -> SampleLimit:
    """The fleet's sample limit now (one read of the live workers' hashes); a 503 if Redis does not answer."""
    try:
        workers = await to_thread.run_sync(live_workers, redis)
    except RedisError as exc:
        raise queue_unavailable(exc) from None
    return SampleLimit.of(workers, worker_slots=worker_slots, has_gpus=bool(fleet.gpus))


def model_tokenizer(model: Model) -> VocabTokenizer:
    try:
        return vocab_tokenizer(model.path)
    except ValueError as exc:  # llama.cpp could not read the file
        # The path and llama.cpp's words go to the log: submitters see neither where files live nor why.
        log.error("model %s: its file %s cannot be read: %s", model.name, model.path, exc)
        raise RequestError(
            422, f"model {model.name!r} cannot be used: its file cannot be read (an admin can see why in the log)"
        ) from None


# A retry with an idempotency key that a concurrent request inserted first gets that
# request's job, as a sequential retry does; a request racing again and again is refused.
IDEMPOTENT_INSERT_ATTEMPTS = 3


async def submit_jobs(
    db: AsyncSession,
    redis: Redis,
    specs: Sequence[JobSpec],
    *,
    timeout_s: int,
    caller: Caller,
    worker_slots: int,
    routing: PrefixRouting = OFF,
) -> list[Accepted]:
    """Validate and accept jobs, all or none, owned by the caller's tenant. The key's limits
    (gpuq/jobs/limits.py) are applied once every check has passed, to the jobs that are new:
    a refused request, or an idempotent replay, spends none of its submissions.
    ``worker_slots`` is ``GPUQ_WORKER_SLOTS``, the samples limit while no worker is live.
    ``routing``: prefix-aware placement (``gpuq.jobs.prefix_routing``), off unless given."""
    specs = [_keep_alive_rule(s, caller) for s in specs]
    # A key already over its limits is refused before its prompts are tokenised; a job with
    # an idempotency key may be a replay, which spends nothing, so only the others count here.
    surely_new = sum(1 for s in specs if s.idempotency_key is None)
    if surely_new:
        await precheck(db, redis, caller, queued_jobs=surely_new, submissions=surely_new)
    models = {name: await db.run_sync(store.find_model, name) for name in {s.model for s in specs}}
    # A job named by an alias is the model's own job from here on: its queue, placement,
    # idempotency hash and history all name the registered model.
    specs = [replace(s, model=found.name) if (found := models[s.model]) is not None else s for s in specs]
    models |= {m.name: m for m in models.values() if m is not None}
    async with tokenising_turn(caller.owner):
        counts = await to_thread.run_sync(
            lambda: [
                check_against_model(s, models[s.model], i if len(specs) > 1 else None) for i, s in enumerate(specs)
            ]
        )
    fleet = await db.run_sync(load_fleet)
    for i, spec in enumerate(specs):
        check_placeable(spec, models[spec.model], fleet, i if len(specs) > 1 else None)
    if any(s.kind == JobKind.GENERATE and s.generation.n > 1 for s in specs):  # n = 1 fits every worker
        limit = await _read_sample_limit(redis, fleet, worker_slots=worker_slots)
        for i, spec in enumerate(specs):
            check_samples(spec, limit, i if len(specs) > 1 else None)
    if any(s.deadline is not None for s in specs):
        await refuse_late_jobs(db, redis, [_planned(s, n, caller) for s, n in zip(specs, counts, strict=True)])
    admitted = False  # the key's limits are applied once: a retry after a race only has fewer jobs
    for _attempt in range(IDEMPOTENT_INSERT_ATTEMPTS):
        earlier = await _earlier_jobs(db, specs, caller.owner)
        new = [
            store.NewJob(
                id=store.new_job_id(),
                kind=s.kind.value,
                model=s.model,
                priority=s.priority,
                request=s.request,
                request_hash=s.request_hash,
                idempotency_key=s.idempotency_key,
                prompt_tokens=None if n is None else n.tokens,
                prompt_ids=None if n is None else n.ids,
                owner=caller.owner,
                api_key_id=caller.key_id,
                deadline=s.deadline,
            )
            for s, n in zip(specs, counts, strict=True)
            if s.idempotency_key is None or s.idempotency_key not in earlier
        ]
        if new and not admitted:
            await admit(db, redis, caller, queued_jobs=len(new), submissions=len(new))
            admitted = True
        try:
            chains = await to_thread.run_sync(_chains, new, models, routing) if new else []
            created = iter(
                await _insert_then_enqueue(db, redis, new, chains, routing, timeout_s=timeout_s) if new else []
            )
        except _RacedOnIdempotencyKey:
            continue  # a concurrent request committed one of these keys first: its job is the answer
        return [
            Accepted(earlier[s.idempotency_key], created=False)
            if s.idempotency_key is not None and s.idempotency_key in earlier
            else Accepted(next(created), created=True)
            for s in specs
        ]
    raise RequestError(409, "an idempotency_key in this request keeps being taken by concurrent requests; retry")


def _planned(spec: JobSpec, counted: Counted | None, caller: Caller) -> Planned | None:
    """A job with a deadline as admission judges it; None for one without."""
    if spec.deadline is None:
        return None
    return Planned(
        model=spec.model,
        kind=spec.kind.value,
        priority=spec.priority,
        owner=caller.owner,
        deadline=spec.deadline,
        jobs=1,
        prompt_tokens=0 if counted is None else counted.tokens,
        uncounted=1 if counted is None and spec.kind != JobKind.NOOP else 0,
        completion_budget=store.completion_budget(spec.kind.value, spec.request),
    )


def _keep_alive_rule(spec: JobSpec, caller: Caller) -> JobSpec:
    """An admin's explicit keep_alive may shorten its model's stay (0 unloads it after the
    job); anyone else's only lengthens it (docs/security.md)."""
    shortens = True if caller.is_admin and spec.params.keep_alive is not None else None
    if spec.params.keep_alive_shortens == shortens:
        return spec
    return replace(spec, params=spec.params.model_copy(update={"keep_alive_shortens": shortens}))


class _RacedOnIdempotencyKey(Exception):
    """The insert lost a race on an idempotency key's unique index (nothing was written)."""


async def _earlier_jobs(db: AsyncSession, specs: Sequence[JobSpec], owner: str) -> dict[str, Job]:
    """The tenant's jobs already submitted under the same idempotency keys; a key reused for
    a different request is an error, not a silent replay."""
    keys = [s.idempotency_key for s in specs if s.idempotency_key is not None]
    if len(keys) != len(set(keys)):
        raise RequestError(422, "the same idempotency_key is used twice in one request")
    earlier = await db.run_sync(store.jobs_by_idempotency_keys, keys, owner)
    for spec in specs:
        job = earlier.get(spec.idempotency_key or "")
        if job is not None and job.request_hash != spec.request_hash:
            raise RequestError(
                409,
                f"idempotency_key {spec.idempotency_key!r} was already used for a different request "
                f"(job {job.id}); use a new key for a new request",
            )
    return earlier


def _chains(
    new: Sequence[store.NewJob], models: dict[str, Model | None], routing: PrefixRouting
) -> list[tuple[bytes, ...] | None]:
    """Each new job's prompt start as block hashes (``gpuq.jobs.prefix_routing``), where routing
    is on and the API built the prompt's tokens; None for the others."""
    if not routing.on:
        return [None] * len(new)
    out: list[tuple[bytes, ...] | None] = []
    for job in new:
        model = models.get(job.model)
        ids = None
        if model is not None and job.prompt_ids is not None:
            ids = unpack_prompt_ids(vocabulary_file_tag(model.path), job.prompt_ids)
        out.append(
            None
            if ids is None or model is None
            else prefix_chain(model.path, job.owner, ids, shared_tenants=routing.shared_tenants)
        )
    return out


async def _insert_then_enqueue(
    db: AsyncSession,
    redis: Redis,
    new: list[store.NewJob],
    chains: list[tuple[bytes, ...] | None],
    routing: PrefixRouting,
    *,
    timeout_s: int,
) -> list[Job]:
    try:
        jobs = await db.run_sync(store.insert_jobs, new)
    except IntegrityError:
        # The other request's row is committed by now (PostgreSQL makes this insert wait for
        # it; SQLite writes one at a time), so reading the keys again finds it.
        await db.rollback()
        raise _RacedOnIdempotencyKey from None
    entries = [QueueEntry.of(n) for n in new]

    def enqueue() -> None:
        placed = place(redis, entries, chains, routing).entries if routing.on else entries
        enqueue_jobs(redis, placed, timeout_s=timeout_s)

    try:
        await to_thread.run_sync(enqueue)
    except RedisError as exc:
        await db.run_sync(store.delete_queued_jobs, [n.id for n in new])
        raise queue_unavailable(exc) from None
    return jobs
