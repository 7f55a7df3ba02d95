"""The typed job request reads every row written before it, and writes the same keys."""

import pytest
from pydantic import ValidationError

from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.request import EmbeddingParams

# Rows as each producer stored them before the typed request existed.
OLD_ROWS = [
    {"max_tokens": 8, "temperature": 0.0, "top_p": 0.9, "seed": 1, "stop": [], "prompt": "Say hi."},
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "temperature": 1.0, "top_p": 1.0,
     "seed": None, "stop": ["\n"], "top_k": 3, "events": "tokens", "keep_alive": 30.0},
    {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.8, "top_p": 0.9, "top_k": 40,
     "repeat_penalty": 1.1, "min_p": 0.0, "max_tokens": 1900, "events": "end", "webhook_url": "https://h.example/x"},
    {"prompt": "x", "max_tokens": 256, "temperature": 1.0, "top_p": 1.0, "seed": None, "stop": [],
     "endpoint": "/v1/completions"},
]  # fmt: skip


@pytest.mark.parametrize("row", OLD_ROWS)
def test_a_row_written_before_reads_back_and_stores_the_same_values(row):
    params = GenerationParams.model_validate(row)
    stored = params.stored()
    assert {k: v for k, v in row.items() if v is not None} == {k: stored[k] for k in row if row[k] is not None}
    assert GenerationParams.model_validate(stored) == params


def test_a_row_without_sampling_keys_gets_llama_cpps_defaults_as_the_worker_did():
    params = GenerationParams.model_validate({"prompt": "x", "max_tokens": 4})
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.repeat_penalty) == (
        0.8, 0.95, 40, 0.05, 1.0
    )  # fmt: skip
    assert params.n == 1 and params.seed is None and params.stop == []


def test_a_grouped_batch_embedding_row_reads_back():
    row = {"input": ["a", "b", "c"], "custom_ids": ["x", "y"], "input_counts": [1, 2], "endpoint": "/v1/embeddings"}
    assert EmbeddingParams.model_validate(row).stored() == row


@pytest.mark.parametrize("bad", [{"temperature": float("nan")}, {"top_p": float("inf")}, {"seed": True}])
def test_nothing_non_finite_or_boolean_is_taken(bad):
    with pytest.raises(ValidationError):
        GenerationParams.model_validate({"prompt": "x", "max_tokens": 4} | bad)
