"""lm-eval's `local-completions` scoring a multiple-choice task through gpuq, as its docs run it
against an OpenAI-compatible server: its remote tokenizer (`/tokenizer_info`, `/tokenize`),
token-id prompts, `echo` with prompt log-probabilities. Its per-choice loglikelihoods and its
accuracy equal those computed directly from llama.cpp's logits for the same tokens."""

import json

import lm_eval
import numpy as np
import pytest
from lm_eval.tasks import TaskManager
from lm_eval.utils import RemoteTokenizer

from tests.e2e.conftest import system_on
from tests.worker.generation import direct_logprobs, engine_like_llama

MODEL = "smollm2-135m"
QUESTIONS = [
    ("What is the capital of France?", ["Paris", "Berlin", "Madrid"], 0),
    ("How many legs does a spider have?", ["six", "eight", "ten"], 1),
    ("What colour is the sky on a clear day?", ["green", "red", "blue"], 2),
    ("Which animal says moo?", ["a cow", "a cat", "a dog"], 0),
    ("What do bees make?", ["milk", "honey", "bread"], 1),
    ("What is frozen water called?", ["steam", "sand", "ice"], 2),
]
TASK = """task: gpuq_quiz
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


# What is checked is the scoring, which no database changes: one database is enough.
@system_on("sqlite")
def test_lm_eval_scores_a_multiple_choice_task_as_llama_cpp_computes_it(system, tmp_path, model_path, monkeypatch):
    data = tmp_path / "quiz.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS))
    (tmp_path / "quiz.yaml").write_text(TASK.format(data=data))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    key = system.processes.admin_key
    monkeypatch.setenv("OPENAI_API_KEY", key)  # what local-completions sends as its Bearer token
    base_url = f"{system.url}/v1/completions"
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "model": MODEL,
            "base_url": base_url,
            "tokenizer_backend": "remote",
            "auth_token": key,
            "num_concurrent": 1,
            "max_retries": 1,
        },
        tasks=["gpuq_quiz"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True,
    )
    samples = sorted(out["samples"]["gpuq_quiz"], key=lambda s: s["doc_id"])
    assert len(samples) == len(QUESTIONS)

    # The same tokens lm-eval sent (its remote tokenizer, its context/continuation split),
    # evaluated directly as the engine evaluates a prompt: fixed chunks of the same size.
    tokenizer = RemoteTokenizer(base_url, 30, True, None, key)
    llm = engine_like_llama(model_path, n_ctx=512)
    correct = 0
    try:
        for sample, (question, choices, answer) in zip(samples, QUESTIONS, strict=True):
            context = f"Question: {question}\nAnswer:"
            direct = []
            for choice in choices:
                context_ids = tokenizer.encode(context)
                whole = tokenizer.encode(context + " " + choice)
                logp = direct_logprobs(llm, whole)
                direct.append(sum(logp[i - 1][whole[i]] for i in range(len(context_ids), len(whole))))
            gpuq = [loglikelihood for loglikelihood, _greedy in sample["filtered_resps"]]
            assert gpuq == pytest.approx(direct, abs=1e-3), question
            correct += int(np.argmax(direct) == answer)
    finally:
        llm.close()
    assert out["results"]["gpuq_quiz"]["acc,none"] == pytest.approx(correct / len(QUESTIONS))
