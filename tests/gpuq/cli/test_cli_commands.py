"""What the client commands say when they work: rules with ranges of GPUs and a delete that
says what it deleted, schedules named by name with their times in their own zone and a run
that names its batch, tables that say when they are empty, durations in human units."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gpuq.cli.client import GpuqClient
from gpuq.cli.support import duration
from tests.gpuq.cli.conftest import MODEL, Api, run


@pytest.fixture
def env(api: Api) -> dict[str, str | None]:
    return {"GPUQ_API_URL": api.url, "GPUQ_API_KEY": api.key, "GPUQ_DATA_DIR": str(api.data_dir)}


def _admin(api: Api) -> httpx.Client:
    return httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {api.key}"})


def test_rules_take_ranges_of_gpus_and_a_delete_says_which_rule_it_was(
    api: Api, env: dict[str, str | None], tmp_path: Path
) -> None:
    added = run(["rules", "add", "--model", "smollm2-*", "--kind", "embed", "--gpus", "2-3,0"], env, tmp_path)
    assert added.exit_code == 0, added.output
    rule_id = int(added.stdout.split()[1])  # "rule 7 saved"
    with _admin(api) as admin:
        [rule] = [r for r in admin.get("/v1/affinity-rules").json()["data"] if r["id"] == rule_id]
    assert rule["gpu_indices"] == [0, 2, 3]

    deleted = run(["rules", "delete", str(rule_id)], env, tmp_path)
    assert deleted.exit_code == 0
    assert deleted.stdout == f"deleted rule {rule_id}: allow smollm2-* embed on gpu_indices=0,2,3\n"
    listed = run(["rules", "list"], env, tmp_path)
    assert listed.exit_code == 0 and listed.stdout == ""  # no bare header
    assert listed.stderr == "no affinity rules: every model may run on every GPU it fits\n"


def test_a_schedule_is_named_by_name_shown_in_its_zone_and_its_run_names_the_batch(
    api: Api, env: dict[str, str | None], tmp_path: Path
) -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "hi"}}
    path = tmp_path / "nightly.jsonl"
    path.write_text(json.dumps(line) + "\n")
    added = run(
        ["schedules", "add", "paris-nightly", "0 2 * * *", str(path), "--timezone", "Europe/Paris"], env, tmp_path
    )
    assert added.exit_code == 0, added.output
    assert added.stdout.endswith("02:00 CET\n")  # 02:00 Paris time, in December

    listed = run(["schedules", "list"], env, tmp_path)
    assert "paris-nightly" in listed.stdout and "02:00 CET" in listed.stdout

    ran = run(["schedules", "run", "paris-nightly"], env, tmp_path)
    assert ran.exit_code == 0, ran.output
    batch_id = ran.stdout.strip()  # the id alone on stdout, for scripts
    with _admin(api) as admin:
        batch = admin.get(f"/v1/batches/{batch_id}").json()
    assert batch["status"] in {"validating", "in_progress"} and batch["request_counts"]["total"] == 1
    assert f"started batch {batch_id}" in ran.stderr and "run done" not in ran.output

    runs = run(["schedules", "runs", "paris-nightly"], env, tmp_path)
    assert batch_id in runs.stdout and "manual" in runs.stdout
    paused = run(["schedules", "pause", "paris-nightly"], env, tmp_path)
    assert paused.stdout.startswith("paused schedule ") and "(paris-nightly)" in paused.stdout
    deleted = run(["schedules", "delete", "paris-nightly"], env, tmp_path)
    assert deleted.exit_code == 0 and "deleted schedule" in deleted.stdout
    assert run(["schedules", "list"], env, tmp_path).stderr.startswith("no schedules")


def test_jobs_show_durations_in_human_units_and_say_when_none_match(env: dict[str, str | None], tmp_path: Path) -> None:
    none = run(["jobs", "--model", "no-such-model"], env, tmp_path)
    assert none.exit_code == 0 and none.stdout == "" and none.stderr == "no jobs match\n"
    assert [duration(ms) for ms in (None, 0, 850, 1234, 14_200, 210_000, 226_339, 7_200_000)] == [
        "",
        "0 ms",
        "850 ms",
        "1.2 s",
        "14 s",
        "3.5 min",
        "3.8 min",
        "2.0 h",
    ]


def test_models_register_takes_a_path_as_this_directory_sees_it_or_says_where_it_looked(
    api: Api, env: dict[str, str | None], model_path: str
) -> None:
    (api.data_dir / "models" / "here.gguf").symlink_to(model_path)
    # From the directory above the models directory, `models/here.gguf` is that file.
    made = run(["models", "register", "here", "models/here.gguf", "--kind", "embed"], env, api.data_dir)
    assert made.exit_code == 0, made.output
    assert made.stdout.startswith("registered here (embed")
    # A path no file here has is read inside the models directory, and the error says so.
    missing = run(["models", "register", "gone", "models/gone.gguf"], env, api.data_dir)
    assert missing.exit_code != 0
    assert f"a relative path is read inside the models directory {api.data_dir / 'models'}" in missing.stderr
    # A file here outside the models directory is still refused.
    (api.data_dir / "elsewhere.gguf").symlink_to(model_path)
    outside = run(["models", "register", "out", "elsewhere.gguf"], env, api.data_dir)
    assert outside.exit_code != 0 and "outside the models directory" in outside.stderr


def test_keys_revoke_leaves_the_keys_jobs_queued_and_with_cancel_jobs_cancels_them(
    api: Api, env: dict[str, str | None], tmp_path: Path
) -> None:
    env = env | {"GPUQ_DATABASE_URL": api.database_url}
    with GpuqClient(api.url, api_key=api.key) as client:
        client.wait_ready()  # the module's API may still be starting
    with _admin(api) as admin:
        made = [admin.post("/v1/keys", json={"name": f"leak-{i}", "owner": "acme"}).json() for i in range(2)]
        jobs = [
            admin.post(
                "/v1/jobs", json={"kind": "noop", "model": MODEL}, headers={"Authorization": f"Bearer {k['key']}"}
            ).json()["id"]
            for k in made
        ]
        revoked = run(["keys", "revoke", made[0]["id"]], env, tmp_path)
        cancelled = run(["keys", "revoke", made[1]["id"], "--cancel-jobs"], env, tmp_path)
        assert revoked.exit_code == 0 and revoked.stdout == f"revoked {made[0]['id']}\n"
        assert cancelled.exit_code == 0, cancelled.output
        assert (
            cancelled.stdout == f"revoked {made[1]['id']}\ncancelled the queued and running jobs of {made[1]['id']}\n"
        )
        assert [admin.get(f"/v1/jobs/{j}").json()["status"] for j in jobs] == ["queued", "cancelled"]
        # a key revoked without it may have its jobs cancelled later
        later = run(["keys", "revoke", made[0]["id"], "--cancel-jobs"], env, tmp_path)
        assert later.exit_code == 0 and later.stdout == f"cancelled the queued and running jobs of {made[0]['id']}\n"
        assert admin.get(f"/v1/jobs/{jobs[0]}").json()["status"] == "cancelled"


def test_keys_weight_is_set_at_creation_changed_by_id_and_listed(
    api: Api, env: dict[str, str | None], tmp_path: Path
) -> None:
    env = env | {"GPUQ_DATABASE_URL": api.database_url}
    made = run(["keys", "create", "--name", "nightly", "--owner", "research", "--weight", "3"], env, tmp_path)
    assert made.exit_code == 0, made.output
    key_id = made.stderr.split()[1]  # "created key_... (submitter for research); ..."
    with _admin(api) as admin:
        assert admin.get("/v1/keys").json()["data"][-1]["weight"] == 3

    changed = run(["keys", "weight", key_id, "5"], env, tmp_path)
    assert changed.exit_code == 0 and changed.stdout == f"{key_id} (research) weighs 5\n"
    listed = run(["keys", "list"], env, tmp_path)
    [line] = [row for row in listed.stdout.splitlines() if key_id in row]
    assert line.split()[4] == "5"  # ID PREFIX ROLE OWNER WEIGHT ...
    assert run(["keys", "weight", key_id, "0"], env, tmp_path).exit_code == 2  # 1 to 1000
    unknown = run(["keys", "weight", "key_nope", "2"], env, tmp_path)
    assert unknown.exit_code == 1 and "does not exist or is revoked" in unknown.stderr


def test_models_alias_and_unalias(api: Api, env: dict[str, str | None]) -> None:
    made = run(["models", "alias", "text-embedding-3-small", "smollm2-135m"], env, api.data_dir)
    assert made.exit_code == 0 and made.stdout.strip() == "text-embedding-3-small -> smollm2-135m", made.output
    listed = run(["models"], env, api.data_dir)
    assert "text-embedding-3-small -> smollm2-135m" in listed.stdout, listed.output
    bad = run(["models", "alias", "x", "nope"], env, api.data_dir)  # one line, non-zero, no traceback
    assert bad.exit_code != 0 and "model 'nope' is not registered" in bad.stderr and "Traceback" not in bad.output
    gone = run(["models", "unalias", "text-embedding-3-small"], env, api.data_dir)
    assert gone.exit_code == 0 and "removed alias text-embedding-3-small" in gone.stdout
    again = run(["models", "unalias", "text-embedding-3-small"], env, api.data_dir)
    assert again.exit_code != 0 and "no alias 'text-embedding-3-small'" in again.stderr
