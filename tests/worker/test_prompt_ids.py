"""A prompt is tokenised once: the API keeps the tokens it counted on the job row, and the
worker runs those tokens instead of tokenising the prompt again. Real SQL, Redis, runner
and model."""

import pytest
from sqlalchemy import select

from gpuq import store
from gpuq.db.tables import Job
from gpuq.jobs.prompt import pack_prompt_ids, vocab_tokenizer, vocabulary_file_tag
from tests.conftest import both_databases
from tests.gpuq.store.test_store import make_job
from tests.worker.generation import real_runner, run_jobs

GREEDY = {"max_tokens": 6, "temperature": 0.0, "top_p": 1.0, "seed": 1, "stop": []}


@pytest.fixture
def worker(database_url, redis_url):
    with real_runner(database_url, redis_url, prompt_cache=False) as parts:
        yield parts.runner, parts.writer, parts.sessions


def _row(sessions, job_id):
    with sessions() as s:
        job = store.get_job(s, job_id)
        ids = s.execute(select(Job.prompt_ids).where(Job.id == job_id)).scalar_one()
    return job, ids


@both_databases
def test_the_worker_runs_the_tokens_on_the_row_and_clears_them(session, worker, model_path):
    runner, writer, sessions = worker
    tokens = vocab_tokenizer(model_path).tokenize(b"The capital of France is", True, True)
    planted = pack_prompt_ids(vocabulary_file_tag(model_path), tokens)
    # The row's tokens are another text's than the request's: what runs shows which was used.
    with_ids, as_text = store.insert_jobs(
        session,
        [
            make_job(request={"prompt": "Count: one, two,"} | GREEDY, prompt_ids=planted),
            make_job(request={"prompt": "The capital of France is"} | GREEDY),
        ],
    )
    run_jobs(runner, [with_ids.id])
    run_jobs(runner, [as_text.id])
    assert writer.flush()
    (ran, ids_after), (reference, _) = _row(sessions, with_ids.id), _row(sessions, as_text.id)
    assert ran.status == reference.status == "succeeded"
    assert ran.prompt_tokens == len(tokens) == reference.prompt_tokens
    assert ran.result["text"] == reference.result["text"]
    assert ids_after is None  # run: the tokens are not kept beside the request


@both_databases
def test_tokens_made_with_another_model_file_are_not_run(session, worker):
    runner, writer, sessions = worker
    foreign = pack_prompt_ids(b"otherfil", [1, 2, 3])
    [job] = store.insert_jobs(session, [make_job(request={"prompt": "Count: one, two,"} | GREEDY, prompt_ids=foreign)])
    run_jobs(runner, [job.id])
    assert writer.flush()
    ran, _ = _row(sessions, job.id)
    assert ran.status == "succeeded" and ran.prompt_tokens > 3  # its own text, tokenised by the worker
