"""Batch finalisation is resumable: a batch left ``finalizing`` (its files could not be
written, or its scheduler died after the claim) is finalised by the next pass."""

import json
import stat
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.batches.schedules import store_inline_requests
from gpuq.batches.service import _output_file_id, advance_batches, cancel_batch, start_batch
from gpuq.db.tables import Batch, File, Job, JobStatus, WebhookDelivery, utcnow
from tests.conftest import both_databases

MODEL = "smollm2-135m"


def chat_line(custom_id: str) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": custom_id}], "max_tokens": 4}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def start(session: Session, redis, directory: Path, custom_ids=("a", "b"), webhook_url=None) -> Batch:
    """A batch of chat lines, queued as the API queues one (its input file under ``directory``)."""
    file = store.save_file(session, store_inline_requests([chat_line(c) for c in custom_ids], directory))
    return start_batch(
        session,
        redis,
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=None,
        priority=1,
        timeout_s=60,
        webhook_url=webhook_url,
        owner="acme",
    )


def finish_lines(session: Session, batch_id: str, *, succeeded=("a",), failed=("b",)) -> None:
    """The lines' jobs end as a worker would have ended them."""
    done = update(Job).where(Job.batch_id == batch_id)
    session.execute(
        done.where(Job.custom_id.in_(succeeded)).values(
            status=JobStatus.SUCCEEDED, result={"text": "hello"}, completion_tokens=1, finished_at=utcnow()
        )
    )
    session.execute(
        done.where(Job.custom_id.in_(failed)).values(status=JobStatus.FAILED, error="boom", finished_at=utcnow())
    )
    session.commit()


def fresh(session: Session, batch_id: str) -> Batch:
    session.expire_all()
    return session.get_one(Batch, batch_id)


def read_jsonl(session: Session, file_id: str | None) -> list[dict]:
    assert file_id is not None, "the batch names the file"
    path = Path(session.get_one(File, file_id).path)
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_finalised_once(session: Session, batch_id: str, *, status="completed") -> Batch:
    """Completed with one output line (a) and one error line (b), owned by the batch's tenant."""
    batch = fresh(session, batch_id)
    assert batch.status == status and batch.finalizing_at is not None
    [ok] = read_jsonl(session, batch.output_file_id)
    [err] = read_jsonl(session, batch.error_file_id)
    assert ok["custom_id"] == "a" and ok["response"]["body"]["choices"][0]["message"]["content"] == "hello"
    assert err["custom_id"] == "b" and err["error"] == {"code": "server_error", "message": "boom"}
    outputs = session.query(File).filter(File.purpose == "batch_output").all()
    assert sorted(f.id for f in outputs) == sorted([batch.output_file_id or "", batch.error_file_id or ""])
    for file in outputs:
        assert file.owner == "acme" and file.line_count == 1 and file.bytes == Path(file.path).stat().st_size
        assert stat.S_IMODE(Path(file.path).stat().st_mode) == 0o600  # the batch's results: gpuq's user only
    leftovers = [p.name for p in Path(outputs[0].path).parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temporary file is left behind
    return batch


def block_files_folder(data_dir: Path, _batch_id: str) -> Path:
    """A file stands where the files folder should be: nothing can be written."""
    blocker = data_dir / "files"
    blocker.write_text("in the way")
    return blocker


def block_output_path(data_dir: Path, batch_id: str) -> Path:
    """A folder stands at the output file's path: the lines are written, the rename fails."""
    blocker = data_dir / "files" / f"{_output_file_id(batch_id, 'output')}.jsonl"
    blocker.mkdir(parents=True)
    return blocker


def unblock(blocker: Path) -> None:
    if blocker.is_dir():
        blocker.rmdir()
    else:
        blocker.unlink()


@both_databases
@pytest.mark.parametrize("block", [block_files_folder, block_output_path])
def test_a_batch_whose_files_could_not_be_written_is_finalised_by_the_next_pass(session, redis, tmp_path, block):
    batch = start(session, redis, tmp_path / "inputs", webhook_url="http://127.0.0.1:9/hook")
    finish_lines(session, batch.id)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    blocker = block(data_dir, batch.id)

    with pytest.raises(OSError):  # the scheduler's duty logs it and tries again later
        advance_batches(session, redis, data_dir)
    stuck = fresh(session, batch.id)
    assert stuck.status == "finalizing" and stuck.output_file_id is None and stuck.error_file_id is None
    assert session.query(File).filter(File.purpose == "batch_output").count() == 0
    assert session.query(WebhookDelivery).count() == 0  # the event is sent when the batch has ended, not before

    unblock(blocker)
    assert advance_batches(session, redis, data_dir) == [batch.id]
    done = assert_finalised_once(session, batch.id)
    [delivery] = session.query(WebhookDelivery).all()
    assert delivery.event == "batch.completed" and delivery.payload["output_file_id"] == done.output_file_id
    assert advance_batches(session, redis, data_dir) == []  # finalised once
    assert session.query(WebhookDelivery).count() == 1


@both_databases
def test_a_batch_left_finalizing_by_a_dead_scheduler_is_finalised_by_the_next_pass(session, redis, tmp_path):
    batch = start(session, redis, tmp_path / "inputs", webhook_url="http://127.0.0.1:9/hook")
    finish_lines(session, batch.id)
    # The dead scheduler claimed the batch and had begun to write: a stale output file is
    # at its path, which the next pass replaces whole.
    session.execute(update(Batch).where(Batch.id == batch.id).values(status="finalizing", finalizing_at=utcnow()))
    session.commit()
    files = tmp_path / "data" / "files"
    files.mkdir(parents=True)
    (files / f"{_output_file_id(batch.id, 'output')}.jsonl").write_text('{"custom_id": "a", "cut sh')

    assert advance_batches(session, redis, tmp_path / "data") == [batch.id]
    done = assert_finalised_once(session, batch.id)
    [delivery] = session.query(WebhookDelivery).all()
    assert delivery.event == "batch.completed"
    assert delivery.payload["output_file_id"] == done.output_file_id
    assert delivery.payload["error_file_id"] == done.error_file_id
    assert delivery.payload["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert advance_batches(session, redis, tmp_path / "data") == []


def test_a_cancelled_batch_left_finalizing_ends_cancelled(session, redis, tmp_path):
    batch = start(session, redis, tmp_path / "inputs", custom_ids=("a", "b", "c"))
    finish_lines(session, batch.id)  # c is still queued: the cancel cancels it
    cancel_batch(session, redis, batch.id)
    session.execute(update(Batch).where(Batch.id == batch.id).values(status="finalizing", finalizing_at=utcnow()))
    session.commit()

    assert advance_batches(session, redis, tmp_path) == [batch.id]
    done = fresh(session, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    errors = {line["custom_id"]: line["error"]["code"] for line in read_jsonl(session, done.error_file_id)}
    assert errors == {"b": "server_error", "c": "batch_cancelled"}


def test_a_batch_left_finalizing_with_a_line_retried_goes_back_to_in_progress(session, redis, tmp_path):
    batch = start(session, redis, tmp_path / "inputs")
    finish_lines(session, batch.id, succeeded=("a",), failed=())  # b still queued, as after a retry that slipped in
    session.execute(update(Batch).where(Batch.id == batch.id).values(status="finalizing", finalizing_at=utcnow()))
    session.commit()

    assert advance_batches(session, redis, tmp_path) == []
    back = fresh(session, batch.id)
    assert back.status == "in_progress" and back.finalizing_at is None and back.output_file_id is None
    finish_lines(session, batch.id, succeeded=(), failed=("b",))
    assert advance_batches(session, redis, tmp_path) == [batch.id]
    assert_finalised_once(session, batch.id)


def test_a_failing_batch_does_not_hold_up_the_others(session, redis, tmp_path):
    stuck = start(session, redis, tmp_path / "inputs")
    fine = start(session, redis, tmp_path / "inputs", custom_ids=("a",))
    finish_lines(session, stuck.id)
    finish_lines(session, fine.id)
    block_output_path(tmp_path, stuck.id)

    with pytest.raises(IsADirectoryError) as raised:
        advance_batches(session, redis, tmp_path)
    assert f"while advancing batch {stuck.id}" in raised.value.__notes__
    assert fresh(session, fine.id).status == "completed" and fresh(session, stuck.id).status == "finalizing"
