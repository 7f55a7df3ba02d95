"""docker-compose.yml and the Dockerfile, checked without a Docker engine (none runs here):
the compose file against the Compose specification's JSON schema (a copy in compose_spec/),
every gpuq service's command against the CLI's own parser, every GPUQ_ variable against
gpuq/settings.py (name and value), and the Dockerfile's arguments, stages and package list
against what the compose file and pyproject.toml expect."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
import yaml

from gpuq.cli.main import main as gpuq_cli
from gpuq.settings import ENV_PREFIX, Settings
from worker.supervisor import DRAIN_TIMEOUT_S

ROOT = Path(__file__).parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SCHEMA = Path(__file__).parent / "compose_spec" / "compose-spec.json"

# ${NAME:-default} and ${NAME-default} (Compose's interpolation); a bare ${NAME} or $NAME has
# no default, so `docker compose up` without a .env would run with an empty value.
_WITH_DEFAULT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?-([^}]*)\}")
_WITHOUT_DEFAULT = re.compile(r"\$(\{[^}]*\}|[A-Za-z_])")


def interpolate(value: Any) -> Any:
    """The file as Compose reads it with no variable set: every default applied."""
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if not isinstance(value, str):
        return value
    text = _WITH_DEFAULT.sub(lambda m: m.group(2), value.replace("$$", "\0"))
    if missing := _WITHOUT_DEFAULT.search(text):
        raise ValueError(f"{value!r}: {missing.group(0)} has no default")
    return text.replace("\0", "$")


def load_compose(text: str | None = None) -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE_FILE.read_text() if text is None else text)  # merge keys (<<) resolved
    return interpolate(raw)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(validator: jsonschema.Draft202012Validator, document: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def parse_command(args: list[str]) -> click.Command:
    """Parse ``gpuq ARGS`` with the CLI's own parser, running nothing: a click.UsageError (or
    BadParameter) for an unknown command, an unknown option or a value of the wrong type."""
    command: click.Command = gpuq_cli
    while isinstance(command, click.Group):
        if not args:
            raise click.UsageError(f"{command.name} needs a subcommand")
        name, *args = args
        found = command.get_command(click.Context(command), name)
        if found is None:
            raise click.UsageError(f"no command {name!r} in `{command.name}`")
        command = found
    command.make_context(command.name, list(args))
    return command


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the list form, NAME=value
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def setting_problems(env: dict[str, str]) -> list[str]:
    """GPUQ_ variables that are no setting, or whose value the setting refuses."""
    fields = {f"{ENV_PREFIX}{name.upper()}": name for name in Settings.model_fields}
    ours = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    problems = [f"{k} is not a setting in gpuq/settings.py" for k in ours if k not in fields]
    try:
        Settings(_env_file=None, **{fields[k]: v for k, v in ours.items() if k in fields})
    except ValueError as exc:  # pydantic's ValidationError
        problems.append(str(exc))
    return problems


def gpuq_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if str(s.get("image", "")).startswith("gpuq:")}


def duration_s(text: str) -> float:
    """Compose's durations: 1h2m3s, 11m, 90s, 500ms."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


# ---------------------------------------------------------------- the compose file


def test_the_compose_file_follows_the_compose_specification(compose, validator):
    assert schema_errors(validator, compose) == []


def test_the_schema_check_refuses_what_docker_compose_would(compose, validator):
    misspelled = json.loads(json.dumps(compose))
    misspelled["services"]["api"]["restrat"] = "always"
    bad_devices = json.loads(json.dumps(compose))
    bad_devices["services"]["supervisor"]["deploy"]["resources"]["reservations"]["devices"] = "all"
    assert any("restrat" in e for e in schema_errors(validator, misspelled))
    assert schema_errors(validator, bad_devices)


def test_the_services_a_gpuq_deployment_needs_are_there(compose):
    services = compose["services"]
    assert {"redis", "postgres", "migrate", "api", "scheduler", "supervisor"} <= set(services)
    assert "--appendonly" in services["redis"]["command"]  # persistence: the queue survives a restart
    assert services["redis"]["command"][services["redis"]["command"].index("--maxmemory-policy") + 1] == "noeviction"
    assert any(v.endswith(":/var/lib/postgresql/data") for v in services["postgres"]["volumes"])
    for name in ("redis", "postgres", "api"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
    for name in ("redis", "postgres", "api", "scheduler", "supervisor", "supervisor-cpu"):
        assert services[name]["restart"] == "unless-stopped", name
    assert services["migrate"]["restart"] == "no"  # once, and the others wait for it
    for name in ("api", "scheduler", "supervisor", "supervisor-cpu"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}, name
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}, name


@pytest.mark.parametrize(
    "service", ["migrate", "api", "scheduler", "supervisor", "supervisor-cpu"], ids=lambda s: f"{s}-command"
)
def test_every_gpuq_service_runs_a_command_the_cli_accepts(compose, service):
    assert service in gpuq_services(compose)
    parse_command(list(compose["services"][service]["command"]))


def test_the_command_check_refuses_unknown_commands_options_and_values():
    parse_command(["api", "--host", "0.0.0.0", "--port", "8000"])
    for args in (["apii"], ["api", "--hots", "x"], ["api", "--port", "eighty"], ["db"], ["db", "upgrde"]):
        with pytest.raises(click.UsageError):
            parse_command(args)


def test_every_gpuq_variable_the_compose_file_sets_is_a_known_setting_with_a_valid_value(compose, monkeypatch):
    for name in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    services = gpuq_services(compose)
    assert {"api", "scheduler", "supervisor"} <= set(services)
    for name, service in services.items():
        env = environment(service)
        assert env["GPUQ_DATABASE_URL"].startswith("postgresql://") and env["GPUQ_REDIS_URL"].startswith("redis://")
        assert setting_problems(env) == [], name


def test_the_setting_check_refuses_unknown_names_and_bad_values(monkeypatch):
    monkeypatch.delenv("GPUQ_WORKER_TTL_S", raising=False)
    assert setting_problems({"GPUQ_HOST_LABEL": "a", "PATH": "/bin"}) == []
    assert setting_problems({"GPUQ_WORKER_TTL": "60"}) == ["GPUQ_WORKER_TTL is not a setting in gpuq/settings.py"]
    assert setting_problems({"GPUQ_WORKER_TTL_S": "1"})  # ge=2
    with pytest.raises(ValueError, match=r"\$\{SECRET\} has no default"):
        load_compose("services: {api: {image: 'gpuq:cpu', environment: {GPUQ_API_KEY: '${SECRET}'}}}")


def test_supervisors_are_given_longer_than_their_drain_to_stop(compose):
    supervisors = {n: s for n, s in gpuq_services(compose).items() if s["command"][0] == "supervisor"}
    assert set(supervisors) == {"supervisor", "supervisor-cpu"}
    for name, service in supervisors.items():
        assert duration_s(service["stop_grace_period"]) > DRAIN_TIMEOUT_S, name
        assert service["init"] is True, name  # signals reach the supervisor, and its exited workers are reaped
        assert environment(service)["GPUQ_HOST_LABEL"], name  # a container's hostname changes on recreate


def test_the_gpu_supervisor_reserves_the_gpus_and_builds_for_cuda(compose):
    service = compose["services"]["supervisor"]
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    ]
    args = service["build"]["args"]
    assert args["GGML_CUDA"] == "on" and args["BUILD_IMAGE"].startswith("nvidia/cuda:")
    assert args["RUNTIME_IMAGE"] == args["BUILD_IMAGE"].replace("-devel-", "-runtime-")
    assert all(a.isdigit() for a in args["CUDA_ARCHITECTURES"].split(";"))
    assert compose["services"]["supervisor-cpu"]["profiles"] == ["cpu"] and service["profiles"] == ["gpu"]


def test_the_api_and_the_scheduler_share_the_data_directory(compose):
    # The scheduler writes batch output files the API serves, and signs webhooks with the secret kept there.
    mounts = {
        name: next(v.split(":")[0] for v in compose["services"][name]["volumes"] if v.split(":")[1] == "/data")
        for name in ("api", "scheduler", "migrate")
    }
    assert len(set(mounts.values())) == 1 and next(iter(mounts.values())) in compose["volumes"]
    for name in mounts:
        assert environment(compose["services"][name])["GPUQ_DATA_DIR"] == "/data"


def test_the_api_health_check_asks_readiness_on_the_port_the_api_listens_on(compose):
    from api.main import create_app

    api = compose["services"]["api"]
    command = api["command"]
    port = command[command.index("--port") + 1]
    check = " ".join(api["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/readyz" in check
    assert api["ports"] == [f"{port}:{port}"]
    assert "/readyz" in create_app(Settings(_env_file=None)).openapi()["paths"]


# ---------------------------------------------------------------- the Dockerfile


def dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)(?:=(.*))?$", DOCKERFILE.read_text(), flags=re.MULTILINE))


def test_every_build_argument_the_compose_file_passes_is_one_the_dockerfile_declares(compose):
    declared = dockerfile_args()
    assert {"BUILD_IMAGE", "RUNTIME_IMAGE", "GGML_CUDA", "CUDA_ARCHITECTURES", "CPU_FLAGS"} <= set(declared)
    for service in compose["services"].values():
        build = service.get("build") or {}
        assert set(build.get("args") or {}) <= set(declared)
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert stages == [("${BUILD_IMAGE}", "build"), ("${RUNTIME_IMAGE}", "runtime")]


def test_the_dockerfile_builds_llama_cpp_without_seeing_a_gpu():
    text = DOCKERFILE.read_text()
    assert '-DGGML_NATIVE=OFF $CPU_FLAGS"' in text  # CPU and CUDA builds both start from it
    assert "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES" in text
    assert dockerfile_args()["GGML_CUDA"] == "off"  # the CPU variant is the default build


def test_the_dockerfile_installs_the_pinned_llama_cpp_and_every_package():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("llama-cpp-python=="))
    text = DOCKERFILE.read_text()
    sed = re.search(r"sed -n '([^']+)' pyproject.toml", text)
    assert sed is not None
    found = subprocess.run(["sed", "-n", sed.group(1), "pyproject.toml"], cwd=ROOT, capture_output=True, text=True)
    assert found.stdout.strip() == pin
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = set(re.findall(r"^COPY (\w+) \1$", text, flags=re.MULTILINE))
    assert set(packages) == copied


def test_the_image_runs_as_its_own_user_with_a_private_data_directory():
    text = DOCKERFILE.read_text()
    runtime = text[text.index("AS runtime") :]
    assert "chown gpuq /data" in runtime and "chmod 700 /data" in runtime  # docs/security.md: Files at rest
    assert re.search(r"^USER gpuq$", runtime, flags=re.MULTILINE)
    assert re.search(r"^ENV .*GPUQ_DATA_DIR=/data", runtime, flags=re.MULTILINE | re.DOTALL)
