"""Token streams on real Redis and SQL: what a worker publishes, a follower reads in order and
whole, however far behind it is; and SQL ends a follow that no worker will end."""

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

from gpuq import store
from gpuq.db.engine import async_engine, async_sessions
from gpuq.db.tables import JobStatus, utcnow
from gpuq.queue_names import Priority
from gpuq.redis_keys import STREAM_DONE_TTL_S, job_stream_key
from gpuq.streams.events import Delta, End, Start
from gpuq.streams.follow import follow_job
from gpuq.streams.publish import StreamPublisher
from tests.conftest import both_databases


@pytest.fixture
async def sessions(database_url):
    engine = async_engine(database_url)
    yield async_sessions(engine)
    await engine.dispose()


def _job(session, *, status=JobStatus.RUNNING) -> str:
    job_id = store.new_job_id()
    new = store.NewJob(
        id=job_id, kind="generate", model="smollm2-135m", priority=Priority.HIGH, request={}, request_hash="x"
    )
    store.insert_jobs(session, [new])
    if status != JobStatus.QUEUED:
        store.claim_job(session, job_id, worker="w", device="cpu")
    return job_id


async def _collect(redis_url, sessions, job_id, **kwargs):
    streams = AsyncRedis.from_url(redis_url)
    try:
        return [event async for event in follow_job(streams, sessions, job_id, **kwargs)]
    finally:
        await streams.aclose()


async def test_a_follower_gets_every_piece_in_order_even_when_it_starts_after_the_job_ended(
    redis, redis_url, session, sessions
):
    job_id = _job(session)
    publisher = StreamPublisher(redis)
    publisher.start(job_id, Start(attempt=1, prompt_tokens=5), max_tokens=3000)
    pieces = [(job_id, Delta(f"<{i}>", 1)) for i in range(3000)]
    publisher.deltas(pieces[:1])
    assert redis.xlen(job_stream_key(job_id)) == 2  # the first text goes out at once: the first token
    for at in range(1, len(pieces), 7):  # steps of several pieces each, the last one the sequence's end
        publisher.deltas(pieces[at : at + 7], now=at + 7 >= len(pieces))
    publisher.ends([(job_id, End(status="succeeded", finish_reason="length", completion_tokens=3000))])

    events = await _collect(redis_url, sessions, job_id)
    assert isinstance(events[0], Start) and isinstance(events[-1], End)
    deltas = events[1:-1]
    assert "".join(d.text for d in deltas) == "".join(f"<{i}>" for i in range(3000))
    assert sum(d.tokens for d in deltas) == events[-1].completion_tokens == 3000
    assert len(deltas) < 3000 / 7  # held text is joined: a reader wakes far less often than once a token
    assert 0 < redis.ttl(job_stream_key(job_id)) <= STREAM_DONE_TTL_S  # bounded in time once ended


async def test_a_new_attempt_starts_the_stream_afresh(redis, redis_url, session, sessions):
    job_id = _job(session)
    publisher = StreamPublisher(redis)
    publisher.start(job_id, Start(attempt=1), max_tokens=10)
    publisher.deltas([(job_id, Delta("first run", 2))])
    publisher.start(job_id, Start(attempt=2), max_tokens=10)  # a dead worker's job, run again
    publisher.deltas([(job_id, Delta("second run", 2))])  # its first text: at once again
    publisher.ends([(job_id, End(status="succeeded"))])
    events = await _collect(redis_url, sessions, job_id)
    assert events == [Start(attempt=2), Delta("second run", 2), End(status="succeeded")]


@both_databases
async def test_a_job_that_ends_with_no_worker_to_say_so_ends_the_follow_from_its_row(redis_url, session, sessions):
    """Cancelled while queued (or failed by the reconciler): the follower reads the row after a silence."""
    job_id = _job(session, status=JobStatus.QUEUED)
    events: list = []

    async def follow():
        events.extend(await _collect(redis_url, sessions, job_id, check_interval_s=0.2))

    with anyio.fail_after(10):  # the follow ends on its own
        async with anyio.create_task_group() as group:
            group.start_soon(follow)
            await anyio.sleep(0.5)  # the follower is blocked on the empty stream by now
            assert not events
            async with sessions() as db:
                assert await db.run_sync(store.cancel_queued_job, job_id)
    assert events == [End(status="cancelled", finish_reason=None, error=None)]


@both_databases
async def test_a_follow_ended_from_the_row_gives_each_samples_finish_reason_as_a_worker_would(
    redis_url, session, sessions
):
    """A job of two samples whose end never reached its stream (Redis lost it, say): the end read
    from its row carries what the worker's end carries, each sample's finish reason."""
    job_id = _job(session)
    choices = [
        {"index": 0, "text": "a", "finish_reason": "stop"},
        {"index": 1, "text": "b c", "finish_reason": "length"},
    ]
    outcome = store.Outcome(
        job_id=job_id,
        worker="w",
        status=JobStatus.SUCCEEDED,
        finished_at=utcnow(),
        result={"text": "a", "finish_reason": "stop", "choices": choices},
        prompt_tokens=3,
        completion_tokens=3,
    )
    store.record_outcomes(session, [outcome])
    [end] = await _collect(redis_url, sessions, job_id, check_interval_s=0.2)
    assert isinstance(end, End) and (end.status, end.finish_reasons) == ("succeeded", ["stop", "length"])
