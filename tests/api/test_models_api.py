"""The model registry over HTTP: the bundled model is there, files are checked before registering."""

import pytest

from tests.conftest import both_databases


@both_databases
def test_the_bundled_model_is_registered_out_of_the_box_in_openai_list_shape(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    [model] = body["data"]
    assert model["id"] == "smollm2-135m" and model["object"] == "model"
    assert model["kinds"] == ["generate", "embed"]
    assert model["context_length"] == 2048 and model["context_length_trained"] == 8192
    assert model["architecture"] == "llama" and model["size_bytes"] == 98_362_432


def test_registering_a_file_in_the_models_directory(client, settings, model_path):
    (settings.models_dir / "family").mkdir()
    (settings.models_dir / "family" / "small.gguf").symlink_to(model_path)
    response = client.post(
        "/v1/models",
        json={"name": "small-embed", "path": "family/small.gguf", "kinds": ["embed"], "context_length": 512},
    )
    assert response.status_code == 201, response.text
    assert response.json()["kinds"] == ["embed"] and response.json()["context_length"] == 512
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["small-embed", "smollm2-135m"]
    again = client.post("/v1/models", json={"name": "small-embed", "path": "family/small.gguf", "kinds": ["generate"]})
    assert again.status_code == 201 and client.get("/v1/models/small-embed").json()["kinds"] == ["generate"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "x", "path": "../../etc/passwd"}, "is outside the models directory"),
        ({"name": "x", "path": "/etc/hostname"}, "is outside the models directory"),
        ({"name": "x", "path": "missing.gguf"}, "does not exist"),
        ({"name": "x", "path": "notes.txt"}, "is not a GGUF file"),
        ({"name": "bad name", "path": "real.gguf"}, "model name 'bad name' is invalid"),
        ({"name": "x", "path": "real.gguf", "context_length": 9000}, "trained for at most 8192"),
        ({"name": "x", "path": "real.gguf", "kinds": []}, "kinds: List should have at least 1 item"),
        ({"name": "x", "path": "real.gguf", "kinds": ["chat"]}, "kinds.0: Input should be 'generate' or 'embed'"),
    ],
)
def test_impossible_registrations_are_refused_and_change_nothing(client, settings, model_path, body, message):
    (settings.models_dir / "notes.txt").write_text("not a model")
    (settings.models_dir / "real.gguf").symlink_to(model_path)
    response = client.post("/v1/models", json=body)
    assert response.status_code == 422 and message in response.json()["detail"], response.text
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["smollm2-135m"]


def test_an_unknown_model_is_a_404(client):
    response = client.get("/v1/models/nope")
    assert response.status_code == 404 and response.json()["detail"] == "model 'nope' is not registered"


def test_the_estimate_counts_the_slots_the_gpu_workers_run(client, settings, model_path):
    """K (GPUQ_WORKER_SLOTS) enters at registration; registering again after changing it updates the figure."""
    (settings.models_dir / "small.gguf").symlink_to(model_path)
    body = {"name": "small", "path": "small.gguf", "kinds": ["generate"], "context_length": 2048}
    settings.worker_slots = 2  # the app reads these settings: as if the API had started with them
    # SmolLM2: (92.10 weights + 2 * 45 KV + 101.125 compute) * 1.05 + 457 CUDA overhead = 754.39 MiB
    assert client.post("/v1/models", json=body).json()["vram_estimate_mib"] == 755
    settings.worker_slots = 8  # (92.10 + 8 * 45 + 101.125) * 1.05 + 457 = 1037.89 MiB
    assert client.post("/v1/models", json=body).json()["vram_estimate_mib"] == 1038
    measured = client.post("/v1/models", json=body | {"vram_mib": 700}).json()
    assert (measured["vram_estimate_mib"], measured["vram_mib"]) == (1038, 700)


@pytest.mark.parametrize("cut", [4, -100])  # the magic alone; a download that stopped short
def test_a_truncated_gguf_is_a_422_that_says_so_and_registers_nothing(client, settings, model_path, cut):
    whole = open(model_path, "rb").read()  # noqa: SIM115
    (settings.models_dir / "cut.gguf").write_bytes(whole[:cut])
    response = client.post("/v1/models", json={"name": "cut", "path": "cut.gguf"})
    assert response.status_code == 422, response.text
    assert "cannot be read as GGUF: it is truncated or corrupt" in response.json()["detail"]
    assert response.json()["error"]["message"] == response.json()["detail"]
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["smollm2-135m"]


@both_databases
def test_submitters_see_a_models_file_name_but_not_where_it_lives_on_the_server(client, make_key, model_path):
    from tests.api.conftest import bearer

    submitter = bearer(make_key("submitter", "acme"))
    [listed] = client.get("/v1/models", headers=submitter).json()["data"]
    one = client.get("/v1/models/smollm2-135m", headers=submitter).json()
    assert listed["path"] == one["path"] == model_path.rsplit("/", 1)[1] and "/" not in listed["path"]
    assert client.get("/v1/models/smollm2-135m").json()["path"] == model_path  # admins see the path


def test_a_model_whose_file_went_bad_is_refused_without_showing_its_path(
    client, settings, make_key, model_path, caplog
):
    from tests.api.conftest import bearer

    link = settings.models_dir / "soon-broken.gguf"
    link.symlink_to(model_path)
    assert client.post("/v1/models", json={"name": "soon-broken", "path": "soon-broken.gguf"}).status_code == 201
    link.unlink()
    link.write_bytes(b"GGUF but not really")  # replaced on disk after registration
    job = {"kind": "generate", "model": "soon-broken", "prompt": "hi", "max_tokens": 4}
    response = client.post("/v1/jobs", json=job, headers=bearer(make_key("submitter", "acme")))
    assert response.status_code == 422 and "its file cannot be read" in response.json()["detail"], response.text
    assert str(settings.models_dir) not in response.text
    assert str(link) in caplog.text  # the admin finds it in the log
