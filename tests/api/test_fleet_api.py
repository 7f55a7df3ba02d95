"""GPUs, affinity rules, the placement preview, and refusing jobs no GPU may run."""

import pytest
from redis import Redis

from gpuq import store
from gpuq.db.tables import Gpu
from gpuq.fleet import health, telemetry
from gpuq.fleet.gpus import simulated_inventory, with_free_memory
from tests.api.conftest import bearer
from tests.conftest import both_databases

MODEL = "smollm2-135m"
GEN = {"kind": "generate", "model": MODEL, "prompt": "hi", "max_tokens": 4}


@pytest.fixture
def fleet(session):
    """A simulated four-GPU host (24, 24, 48, 80 GiB) recorded as a supervisor records it."""
    inventory = simulated_inventory("node1", [24, 24, 48, 80])
    store.upsert_gpus(
        session,
        [
            Gpu(
                uuid=g.uuid,
                host="node1",
                index=g.index,
                name=g.name,
                memory_total_mib=g.memory_total_mib,
                simulated=True,
            )
            for g in inventory.gpus
        ],
    )
    return inventory


def register_big_copy(client, settings, model_path, name="big", vram_mib=60 * 1024):
    (settings.models_dir / f"{name}.gguf").symlink_to(model_path)
    body = {"name": name, "path": f"{name}.gguf", "kinds": ["generate"], "vram_mib": vram_mib}
    assert client.post("/v1/models", json=body).status_code == 201


@both_databases
def test_gpus_are_listed_with_live_telemetry_when_a_supervisor_publishes_it(client, fleet, redis_url):
    listed = client.get("/v1/gpus").json()["data"]
    assert [g["memory_total_mib"] for g in listed] == [24576, 24576, 49152, 81920]
    assert all(g["simulated"] and "(simulated)" in g["name"] and not g["live"] for g in listed)
    telemetry.publish(Redis.from_url(redis_url), [with_free_memory(fleet.gpus[3], 1000)])
    live = client.get("/v1/gpus").json()["data"][3]
    assert live["live"] and live["memory_free_mib"] == 81920 - 1000


def test_a_model_bigger_than_all_gpus_together_is_refused_with_the_reasons(
    client, fleet, settings, model_path, job_rows
):
    register_big_copy(client, settings, model_path, vram_mib=200 * 1024)  # the host has 176 GiB in all
    response = client.post("/v1/jobs", json=GEN | {"model": "big"})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith(
        "no GPU, nor GPUs of one host together, may run generate jobs of model 'big': GPU 0 on node1: too small"
    )
    assert "GPU 3 on node1: too small: the model needs 204800 MiB, the GPU has 81920 MiB" in detail
    assert job_rows() == []


def test_a_model_too_big_for_any_one_gpu_is_accepted_for_a_gpu_group(client, fleet, settings, model_path):
    register_big_copy(client, settings, model_path, vram_mib=100 * 1024)  # 80 + 48 GiB hold it
    assert client.post("/v1/jobs", json=GEN | {"model": "big"}).status_code == 202


def test_a_job_whose_rules_allow_no_gpu_that_fits_is_refused(client, fleet, settings, model_path, job_rows):
    register_big_copy(client, settings, model_path)  # 60 GiB: only the 80 GiB GPU fits
    assert client.post("/v1/jobs", json=GEN | {"model": "big"}).status_code == 202
    rule = {"model_pattern": "big", "effect": "allow", "gpu_indices": [0, 1]}
    assert client.post("/v1/affinity-rules", json=rule).status_code == 201
    refused = client.post("/v1/jobs", json=GEN | {"model": "big"})
    assert refused.status_code == 422 and "not allowed" in refused.json()["detail"]
    assert len(job_rows()) == 1


@both_databases
def test_rules_crud_with_warnings_and_the_preview(client, fleet, settings, model_path):
    register_big_copy(client, settings, model_path)
    created = client.post(
        "/v1/affinity-rules",
        json={"model_pattern": "smollm2-*", "kind": "embed", "effect": "allow", "gpu_indices": [2, 3]},
    )
    assert created.status_code == 201 and created.json()["warnings"] == []
    rule_id = created.json()["rule"]["id"]
    orphan = client.post(
        "/v1/affinity-rules", json={"model_pattern": "nothing-*", "effect": "deny", "gpu_indices": [7]}
    )
    assert orphan.status_code == 201
    assert orphan.json()["warnings"] == [
        "the rule selects none of the 4 known GPUs",
        "no registered model matches 'nothing-*'",
    ]
    assert [r["id"] for r in client.get("/v1/affinity-rules").json()["data"]] == [rule_id, orphan.json()["rule"]["id"]]

    preview = client.get("/v1/affinity-rules/preview", params={"model": MODEL, "kind": "embed"}).json()
    assert [g["may_run"] for g in preview["gpus"]] == [False, False, True, True]
    assert preview["summary"] == f"{MODEL} may run on 2 of 4 GPUs: node1/2, node1/3"
    assert preview["gpus"][0]["reasons"][0] == "allow rules confine this model to other GPUs"
    generate = client.get("/v1/affinity-rules/preview", params={"model": MODEL}).json()
    assert all(g["may_run"] for g in generate["gpus"])  # the rule names embed jobs only
    slots = settings.slots_for(on_gpu=True)
    assert generate["vram_slots"] == slots and f"K={slots} sequences of 2048 tokens" in generate["vram_basis"]
    assert (
        generate["gpus"][0]["reasons"][1]
        == f"fits: needs {generate['vram_mib']} MiB of 24576 MiB ({generate['vram_basis']})"
    )
    big = client.get("/v1/affinity-rules/preview", params={"model": "big"}).json()
    assert [g["may_run"] for g in big["gpus"]] == [False, False, False, True]
    assert big["vram_mib"] == 60 * 1024 and big["vram_basis"] == "measured by an admin"

    replaced = client.put(
        f"/v1/affinity-rules/{rule_id}", json={"model_pattern": "smollm2-*", "effect": "deny", "gpu_indices": [0]}
    )
    assert replaced.status_code == 200 and replaced.json()["rule"]["effect"] == "deny"
    assert client.delete(f"/v1/affinity-rules/{rule_id}").status_code == 204
    assert client.delete(f"/v1/affinity-rules/{rule_id}").status_code == 404


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model_pattern": "a b", "effect": "allow"}, "model pattern 'a b' may use only"),
        ({"model_pattern": "x[", "effect": "allow"}, "unclosed"),
        ({"model_pattern": "x", "effect": "maybe"}, "effect: Input should be 'allow' or 'deny'"),
        ({"model_pattern": "x", "effect": "allow", "gpu_indices": [-1]}, "gpu_indices.0: Input should be greater"),
        ({"model_pattern": "x", "effect": "allow", "gpu_uuids": ["nope"]}, "gpu_uuids.0: String should match"),
        ({"model_pattern": "x", "effect": "allow", "kind": "chat"}, "kind: Input should be 'generate' or 'embed'"),
        ({"model_pattern": "x", "effect": "allow", "gpu_name_pattern": "*[H100"}, "unclosed"),
        ({"model_pattern": "x", "effect": "allow", "min_memory_mib": 0}, "min_memory_mib: Input should be greater"),
    ],
)
def test_invalid_rules_are_a_422_and_save_nothing(client, body, message):
    response = client.post("/v1/affinity-rules", json=body)
    assert response.status_code == 422 and message in response.json()["detail"], response.text
    assert client.get("/v1/affinity-rules").json()["data"] == []


def test_preview_of_an_unknown_model_and_a_fleet_without_gpus(client):
    assert client.get("/v1/affinity-rules/preview", params={"model": "nope"}).status_code == 404
    cpu_only = client.get("/v1/affinity-rules/preview", params={"model": MODEL}).json()
    assert cpu_only["gpus"] == [] and cpu_only["summary"] == "no GPUs are registered: CPU workers run every model"


def test_clearing_an_unhealthy_gpu(client, fleet, session, redis):
    uuid = fleet.gpus[0].uuid
    store.set_gpu_health(session, uuid, healthy=False, reason="3 CUDA errors in a row")
    health.mark_too_small(redis, (uuid,), "big-model", ttl_s=3600)
    health.mark_too_small(redis, (fleet.gpus[1].uuid,), "big-model", ttl_s=3600)
    assert client.get("/v1/gpus").json()["data"][0]["unhealthy_reason"] == "3 CUDA errors in a row"
    assert client.post(f"/v1/gpus/{uuid}/clear").status_code == 200
    assert client.get("/v1/gpus").json()["data"][0]["healthy"]
    # Clearing also forgets what the GPU was found too small for (only that GPU's marks).
    assert health.too_small_models(redis, (uuid,)) == set()
    assert health.too_small_models(redis, (fleet.gpus[1].uuid,)) == {"big-model"}
    assert client.post("/v1/gpus/GPU-missing/clear").status_code == 404


def test_each_gpu_lists_the_models_it_was_found_too_small_for_until_cleared(client, fleet, redis, make_key):
    first, second = fleet.gpus[0].uuid, fleet.gpus[1].uuid
    health.mark_too_small(redis, (first,), "big-model", ttl_s=3600)
    health.mark_too_small(redis, (first,), "huge-model", ttl_s=3600)
    health.mark_too_small(redis, (second,), "gone-model", ttl_s=0.01)  # expired by the time it is read
    listed = {g["uuid"]: g["too_small_for"] for g in client.get("/v1/gpus").json()["data"]}
    assert listed[first] == ["big-model", "huge-model"] and listed[second] == []
    assert client.post(f"/v1/gpus/{first}/clear").status_code == 200
    assert [g["too_small_for"] for g in client.get("/v1/gpus").json()["data"]] == [[], [], [], []]
    assert client.get("/v1/gpus", headers=bearer(make_key("submitter", "acme"))).status_code == 403


def test_a_rule_may_name_a_mig_device_by_its_uuid(client, fleet):
    mig = "MIG-5eed0000-0001-4000-8000-000000000001"
    response = client.post("/v1/affinity-rules", json={"model_pattern": MODEL, "effect": "allow", "gpu_uuids": [mig]})
    assert response.status_code == 201, response.text
    assert response.json()["rule"]["gpu_uuids"] == [mig]
    refused = client.post("/v1/affinity-rules", json={"model_pattern": MODEL, "effect": "allow", "gpu_uuids": ["0"]})
    assert refused.status_code == 422


@both_databases
def test_a_rule_that_leaves_a_model_no_gpu_is_saved_with_a_warning_saying_so(client, fleet):
    denied = client.post("/v1/affinity-rules", json={"model_pattern": MODEL, "kind": "generate", "effect": "deny"})
    assert denied.status_code == 201
    assert denied.json()["warnings"] == [
        f"{MODEL} now has no GPU it may run generate jobs on: they will be refused until a rule allows a GPU that "
        f"holds it (GET /v1/affinity-rules/preview?model={MODEL}&kind=generate says why)"
    ]
    refused = client.post("/v1/jobs", json=GEN)
    assert refused.status_code == 422  # what the warning said
    # A rule that leaves it somewhere says nothing of the kind.
    partial = client.post("/v1/affinity-rules", json={"model_pattern": MODEL, "effect": "deny", "gpu_indices": [0]})
    assert [w for w in partial.json()["warnings"] if "embed jobs" in w] == []
