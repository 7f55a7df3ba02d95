"""`n` choices and log-probabilities through the official `openai` and `ollama` clients against
a running gpuq (API and a worker as real processes)."""

import math
from collections import defaultdict

import ollama
import openai
import pytest

from tests.e2e.conftest import system_on

pytestmark = system_on("postgresql")  # PostgreSQL: results holding n choices and their log-probabilities

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "Name three primary colours."}]
HOT = {"temperature": 1.0, "top_p": 1.0, "seed": 99}
GREEDY = {"temperature": 0.0, "seed": 1}
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(system):
    with openai.OpenAI(base_url=f"{system.url}/v1", api_key=system.processes.admin_key, max_retries=0) as c:
        yield c


def test_n_choices_come_from_one_prompt_with_an_index_each_streamed_or_not(system, client):
    one = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, **HOT)
    three = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, n=3, **HOT)
    assert [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.message.content for c in three.choices]
    assert len(set(texts)) > 1  # three samples, not one three times
    # Choice 0 is seeded as a one-choice call with the same seed; the prompt is counted once.
    assert texts[0] == one.choices[0].message.content
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    job = system.client.job(three.id.split("-", 1)[1])
    per_choice = [c["completion_tokens"] for c in job["result"]["choices"]]
    assert three.usage.completion_tokens == job["completion_tokens"] == sum(per_choice)

    streamed: dict[int, str] = defaultdict(str)
    finishes = {}
    for chunk in client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, n=3, stream=True, **HOT):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert [streamed[i] for i in range(3)] == texts
    assert finishes == {c.index: c.finish_reason for c in three.choices}


def test_chat_logprobs_with_top_alternatives_cover_the_answer_token_by_token(client):
    answer = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=10, logprobs=True, top_logprobs=3, **GREEDY
    )
    choice = answer.choices[0]
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content
    for token in content:
        assert len(token.top_logprobs) == 3 and token.logprob <= 0
        assert [t.logprob for t in token.top_logprobs] == sorted((t.logprob for t in token.top_logprobs), reverse=True)
        assert token.token == token.top_logprobs[0].token  # greedy: the most likely token each time
        assert bytes(token.bytes).decode() == token.token
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, **GREEDY)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == choice.message.content


def test_completions_echo_scores_the_prompt_as_an_eval_harness_reads_it(client):
    scored = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, logprobs=2, echo=True, **GREEDY)
    choice = scored.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT) and "".join(lp.tokens) == choice.text
    # The first token has nothing before it; each other prompt token has its log-probability.
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    prompt_tokens = scored.usage.prompt_tokens
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert len(lp.tokens) == prompt_tokens + scored.usage.completion_tokens
    # The answer's part equals what a call without echo reports (the prompt's KV is the same).
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, logprobs=2, **GREEDY).choices[0]
    assert plain.text == choice.text[len(PROMPT) :]
    assert plain.logprobs.tokens == lp.tokens[prompt_tokens:]
    assert plain.logprobs.token_logprobs == pytest.approx(lp.token_logprobs[prompt_tokens:], abs=1e-6)
    assert plain.logprobs.text_offset[0] == len(PROMPT)
    assert all(len(top) <= 2 and math.isfinite(sum(top.values())) for top in plain.logprobs.top_logprobs)


def test_ollama_logprobs_in_its_own_shape_streamed_and_not(system):
    client = ollama.Client(host=system.url, headers={"Authorization": f"Bearer {system.processes.admin_key}"})
    options = {"num_predict": 8, "temperature": 0, "seed": 1}
    whole = client.generate(model=MODEL, prompt=PROMPT, raw=True, options=options, logprobs=True, top_logprobs=2)
    assert "".join(t.token for t in whole.logprobs) == whole.response
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in whole.logprobs)
    parts = list(client.generate(model=MODEL, prompt=PROMPT, raw=True, options=options, logprobs=True, stream=True))
    streamed = [t for p in parts for t in (p.logprobs or [])]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in whole.logprobs]
