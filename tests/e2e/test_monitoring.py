"""Every metric the alert rules and the Grafana dashboard in monitoring/ name is exported by a
live /metrics: the API and a supervisor with its worker as real processes, after real jobs
ran, plus one GPU reporting what NVML reports (utilisation, temperature, power: a simulated
GPU has none of them), published as a supervisor on a GPU host publishes it."""

from __future__ import annotations

import re
import time

import httpx
from redis import Redis

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.fleet import telemetry
from gpuq.fleet.gpus import GpuInfo
from tests.inventory import record_gpus
from tests.metrics_parsing import samples
from tests.monitoring.files import alert_rules, dashboard_queries

MODEL = "smollm2-135m"
NVML_GPU = GpuInfo(0, "GPU-8f2c1a7e-nvml", "NVIDIA H100 80GB HBM3", 81559, 70000, 87, 64, 412.5, "9.0")
PROMETHEUS_OWN = {"up"}  # what Prometheus records about each scrape itself


def named_metrics() -> dict[str, set[str]]:
    """The metric names in each file's PromQL: gpuq's own start with gpuq_ (and nothing else does)."""
    queries = {"gpuq-alerts.yml": [r["expr"] for r in alert_rules()], "grafana-dashboard.json": dashboard_queries()}
    return {
        source: set(re.findall(r"\bgpuq_[a-z0-9_]+", " ".join(q))) | set(re.findall(r"\bup(?=\{)", " ".join(q)))
        for source, q in queries.items()
    }


def scrape(processes, url: str) -> set[str]:
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {processes.admin_key}"}, timeout=30)
    assert response.status_code == 200, response.text
    return {name for name, _labels in samples(response.text)}


def test_every_metric_the_rules_and_the_dashboard_name_is_exported(processes):
    processes.settings |= {"GPUQ_SIMULATED_GPUS": "24", "GPUQ_WORKER_THREADS": "1"}
    _api, url = processes.start_api()
    processes.start_supervisor(expected_workers=1)
    engine = sync_engine(processes.database_url)
    with sync_sessions(engine)() as session:
        record_gpus(session, "gpu-host", [NVML_GPU])
    engine.dispose()
    redis = Redis.from_url(processes.redis_url)
    telemetry.publish(redis, [NVML_GPU])
    redis.close()
    with processes.client(url) as client:
        jobs = [{"kind": "generate", "model": MODEL, "prompt": "Hi", "max_tokens": 3, "temperature": 0},
                {"kind": "embed", "model": MODEL, "input": "hi"}]  # fmt: skip
        done = [client.wait(j["id"], timeout_s=180) for j in client.submit_many(jobs)]
        assert [j["status"] for j in done] == ["succeeded", "succeeded"]
        client.submit({"kind": "generate", "model": MODEL, "prompt": "Hi", "max_tokens": 3, "priority": "low"})

    deadline = time.monotonic() + 10  # workers send their counts every 0.5 s
    exported = scrape(processes, url)
    while "gpuq_jobs_total" not in exported and time.monotonic() < deadline:
        time.sleep(0.2)
        exported = scrape(processes, url)

    named = named_metrics()
    assert len(named["gpuq-alerts.yml"]) >= 8 and len(named["grafana-dashboard.json"]) >= 15
    for source, names in named.items():
        assert names - exported - PROMETHEUS_OWN == set(), f"{source} names metrics /metrics does not export"
