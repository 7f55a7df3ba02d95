"""The tokenizer routes (/tokenize, /detokenize, /tokenizer_info, as vLLM and llama.cpp's
server answer them) on the bundled model's real vocabulary; token-id prompts refused before
any job exists when an id is not the model's; bodies read as JSON whatever their
Content-Type says. The API in-process, no worker: none of this runs a job."""

import json

import pytest

from gpuq import store
from gpuq.db.tables import Model
from tests.api.conftest import bearer, redis_job_keys

MODEL = "smollm2-135m"
TEXT = "Hello <|im_end|> wörld 😀"  # a special marker, a two-byte and a four-byte character


def tokenize(client, **body):
    response = client.post("/tokenize", json={"model": MODEL} | body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_text_tokenised_and_detokenised_comes_back_whole(client):
    answer = tokenize(client, prompt=TEXT)
    ids = answer["tokens"]
    assert answer["count"] == len(ids) > 5 and answer["max_model_len"] == 2048 and answer["token_strs"] is None
    eos = client.get("/tokenizer_info", params={"model": MODEL}).json()["eos_token_id"]
    assert ids.count(eos) == 1  # the marker is its one special token, not its characters
    back = client.post("/detokenize", json={"model": MODEL, "tokens": ids})
    assert back.status_code == 200 and back.json() == {"prompt": TEXT, "content": TEXT}
    # Markers read as text when asked: more tokens, none of them the special one.
    plain = tokenize(client, prompt=TEXT, parse_special=False)["tokens"]
    assert eos not in plain and len(plain) > len(ids)


def test_pieces_and_token_strings_are_given_when_asked(client):
    ids = tokenize(client, prompt=TEXT)["tokens"]
    pieces = tokenize(client, content=TEXT, with_pieces=True)["tokens"]  # llama.cpp's names
    assert [p["id"] for p in pieces] == ids
    # A piece that holds part of a character is its bytes, as llama.cpp's server gives it.
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert raw.decode() == TEXT and any(isinstance(p["piece"], list) for p in pieces)
    strs = tokenize(client, prompt="Hello world", return_token_strs=True)["token_strs"]
    assert strs == ["Hello", "Ġworld"]  # the vocabulary's own spelling (GPT-2 style), as vLLM gives it


def test_messages_are_tokenised_as_the_chat_template_renders_them(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ids = tokenize(client, messages=messages)["tokens"]
    text = client.post("/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"]
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    refused = client.post("/tokenize", json={"model": MODEL, "messages": messages, "add_generation_prompt": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "add_generation_prompt"


def test_tokenizer_info_has_what_lm_evals_remote_tokenizer_reads(client):
    """lm-eval (lm_eval/utils.py RemoteTokenizer) reads eos_token, bos_token, pad_token and
    chat_template, and finds the ids by tokenising those texts without special tokens added."""
    info = client.get("/tokenizer_info").json()  # no model: the one registered file
    assert info["model"] == MODEL and info["vocab_size"] == 49152 and info["model_max_length"] == 2048
    assert (info["eos_token"], info["bos_token"]) == ("<|im_end|>", "<|im_start|>")
    assert "<|im_start|>" in info["chat_template"] and info["add_bos_token"] is False
    for name in ("eos", "bos", "pad"):
        probe = client.post("/tokenize", json={"prompt": info[f"{name}_token"], "add_special_tokens": False})
        assert probe.json()["tokens"] == [info[f"{name}_token_id"]]


def test_the_model_can_be_left_out_only_while_one_file_is_registered(client, session, settings, model_path):
    bundled = store.get_model(session, MODEL)
    columns = {c.name: getattr(bundled, c.name) for c in Model.__table__.columns}
    store.save_model(session, Model(**columns | {"name": "alias", "can_generate": False}))  # the same file
    (settings.models_dir / "other.gguf").symlink_to(model_path)
    assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 200
    assert client.get("/tokenizer_info").json()["model"] == MODEL  # the one that generates
    assert client.post("/v1/models", json={"name": "other", "path": "other.gguf"}).status_code == 201
    for response in (client.post("/tokenize", json={"prompt": "hi"}), client.get("/tokenizer_info")):
        assert response.status_code == 400 and response.json()["error"]["code"] == "model_required"
        assert "alias, other, smollm2-135m" in response.json()["error"]["message"]
    assert client.post("/tokenize", json={"model": "other", "prompt": "hi"}).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("POST", "/detokenize", {"model": MODEL, "tokens": [1, 49152]}, 400, "tokens[1] is 49152, not a token id"),
        ("POST", "/detokenize", {"model": MODEL, "tokens": [-1]}, 400, "tokens[0] is -1"),
        ("POST", "/tokenize", {"model": "nope", "prompt": "hi"}, 404, "model 'nope' is not registered"),
        ("GET", "/tokenizer_info?model=nope", None, 404, "model 'nope' is not registered"),
        ("POST", "/tokenize", {"model": MODEL}, 422, "give exactly one of `prompt`"),
        ("POST", "/tokenize", {"model": MODEL, "prompt": "a", "messages": [{"role": "user"}]}, 422, "exactly one"),
        ("POST", "/tokenize", {"model": MODEL, "prompt": "a", "tools": []}, 422, "tools: Extra inputs"),
    ],
)
def test_tokenizer_refusals_say_what_to_fix_in_openais_shape(client, method, path, body, status, says):
    response = client.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"]


def test_the_tokenizer_routes_need_a_key_as_the_model_routes_do(client):
    for method, path, body in [
        ("POST", "/tokenize", {"model": MODEL, "prompt": "hi"}),
        ("POST", "/detokenize", {"model": MODEL, "tokens": [1]}),
        ("GET", "/tokenizer_info", None),
    ]:
        for headers in ({"Authorization": ""}, bearer("gpuq_unknown")):
            response = client.request(method, path, json=body, headers=headers)
            assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer"
            completions = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}, headers=headers)
            assert response.json() == completions.json()  # the same refusal as on /v1/completions


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        ("/v1/completions", {"prompt": [5, 49152, 7]}, "prompt", "prompt[1] is 49152, not a token id of this model"),
        ("/v1/completions", {"prompt": [[5, -3]]}, "prompt", "prompt[1] is -3"),
        ("/v1/completions", {"prompt": [[5], [6]]}, "prompt", "one prompt per request"),
        ("/v1/completions", {"prompt": [[]]}, "prompt", "prompt is empty"),
        ("/v1/completions", {"prompt": [1] * 2040, "max_tokens": 10}, "max_tokens", "the prompt is 2040 tokens"),
        ("/v1/embeddings", {"input": [[1, 2], [3, 99999]]}, "input", "input[1][1] is 99999"),
        ("/v1/embeddings", {"input": [[1, 2], []]}, "input", "input[1] is empty"),
        ("/v1/embeddings", {"input": [1] * 2049}, "input", "input[0] is 2049 tokens"),
    ],
)
def test_token_ids_a_model_cannot_run_are_a_400_before_any_job_exists(client, redis, job_rows, path, body, param, says):
    response = client.post(path, json={"model": MODEL} | body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert says in error["message"] and error["param"] == param
    assert job_rows() == [] and redis_job_keys(redis) == []


def test_a_body_without_a_json_content_type_is_read_as_json(client):
    """As curl -d sends it (form-encoded), as litellm's Ollama providers send it (no type)."""
    body = b'{"model": "smollm2-135m"}'
    for headers in ({}, {"Content-Type": "application/x-www-form-urlencoded"}, {"Content-Type": "text/plain"}):
        shown = client.post("/api/show", content=body, headers=headers)
        assert shown.status_code == 200 and shown.json()["details"]["family"] == "llama", shown.text
        counted = client.post("/tokenize", content=b'{"prompt": "Hello world"}', headers=headers)
        assert counted.status_code == 200 and counted.json()["count"] == 2, counted.text
    # A body that is not JSON is still a 400 in each route's own shape.
    ollama = client.post("/api/show", content=b"model=smollm2-135m", headers={"Content-Type": "text/plain"})
    assert ollama.status_code == 400 and "not valid JSON" in ollama.json()["error"]
    openai = client.post("/v1/chat/completions", content=b"hello")
    assert openai.status_code == 400 and openai.json()["error"]["code"] == "invalid_json"


def test_the_input_guard_reads_a_body_without_a_content_type_too(client, job_rows):
    response = client.post("/api/embed", content=b'{"model": "smollm2-135m", "input": ["a\\udfff"]}')
    assert response.status_code == 400 and "lone UTF-16 surrogate" in response.json()["error"]
    assert job_rows() == []


def test_the_openapi_document_declares_the_tokenizer_routes_and_their_refusals(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path, method in [("/tokenize", "post"), ("/detokenize", "post"), ("/tokenizer_info", "get")]:
        responses = paths[path][method]["responses"]
        assert {"200", "400", "401", "404", "422", "500"} <= set(responses), path
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    tokenize_answer = paths["/tokenize"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert tokenize_answer["$ref"].endswith("/TokenizeResponse")


def _line(custom_id, url, **body):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": MODEL} | body})


def test_batch_lines_take_token_ids_as_the_routes_do(client, redis, job_rows):
    def batch(*lines):
        uploaded = client.post(
            "/v1/files", files={"file": ("in.jsonl", "\n".join(lines).encode())}, data={"purpose": "batch"}
        )
        body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
        return client.post("/v1/batches", json=body)

    refused = batch(
        _line("ok", "/v1/completions", prompt=[1, 2, 3]),
        _line("bad", "/v1/completions", prompt=[[1, 49152]]),
        _line("two", "/v1/completions", prompt=[[1], [2]]),
        _line("vec", "/v1/embeddings", input=[[5], [6, -1]]),
    )
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert "line 2: prompt[1] is 49152, not a token id" in detail and "line 4: input[1][1] is -1" in detail
    assert "line 3: body.prompt: give one prompt a line" in detail
    assert job_rows() == [] and redis_job_keys(redis) == []

    accepted = batch(
        _line("flat", "/v1/completions", prompt=[1, 2, 3]),
        _line("nested", "/v1/completions", prompt=[[4, 5]]),
        _line("vec", "/v1/embeddings", input=[[5], [6, 7]]),
        _line("mixed", "/v1/embeddings", input=[8, 9]),
    )
    assert accepted.status_code == 200, accepted.text
    requests = sorted((row.kind, row.request.get("prompt_token_ids") or row.request["input"]) for row in job_rows())
    assert requests == [("embed", [[5], [6, 7], [8, 9]]), ("generate", [1, 2, 3]), ("generate", [4, 5])]


def test_gpuqs_jobs_api_takes_token_ids_and_refuses_ones_outside_the_vocabulary(client, redis, job_rows):
    accepted = client.post("/v1/jobs", json={"kind": "generate", "model": MODEL, "prompt_token_ids": [5, 6, 7]})
    assert accepted.status_code == 202 and accepted.json()["prompt_tokens"] == 3, accepted.text
    job = client.get(f"/v1/jobs/{accepted.json()['id']}").json()
    assert job["request"]["prompt_token_ids"] == [5, 6, 7] and job["request"].get("prompt") is None
    before = len(job_rows())
    refused = client.post("/v1/jobs", json={"kind": "generate", "model": MODEL, "prompt_token_ids": [5, 49152]})
    assert refused.status_code == 422 and "[1] is 49152" in refused.json()["error"]["message"], refused.text
    both = client.post("/v1/jobs", json={"kind": "generate", "model": MODEL, "prompt": "hi", "prompt_token_ids": [5]})
    assert both.status_code == 422 and "exactly one of" in both.json()["error"]["message"]
    assert len(job_rows()) == before
