"""monitoring/: the alert rules pass `promtool check rules`, fire as their unit tests say
(`promtool test rules`), and the Grafana dashboard's queries are valid PromQL. promtool comes
from Debian's prometheus package (scripts/install.sh --with-browser, which `make test` runs);
without it these tests fail, naming the fix, rather than skip. Which metrics the rules and
the dashboard name is checked against a live /metrics in tests/e2e/test_monitoring.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.monitoring.files import DASHBOARD, MONITORING, RULE_TESTS, RULES, alert_rules, dashboard_queries

ROOT = Path(__file__).parents[2]
# Grafana's variables, as Grafana itself substitutes them before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$host": ".*"}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.fail(
            "promtool is missing: `./scripts/install.sh --with-browser` (what `make test` runs) puts Debian's "
            "into .venv/bin; or install Prometheus and put promtool on the PATH"
        )
    return found


def run(promtool: str, *args: str | Path, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_rules_pass_promtool_check(promtool):
    checked = run(promtool, "check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


def test_each_alert_fires_as_its_unit_test_expects(promtool):
    tested = run(promtool, "test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert fired == {rule["alert"] for rule in alert_rules()}  # every alert is shown firing at least once


def test_promtool_refuses_broken_rules_and_alerts_that_do_not_fire(promtool, tmp_path):
    broken = RULES.read_text().replace("gpuq_redis_up == 0", "gpuq_redis_up == == 0")
    (tmp_path / "gpuq-alerts.yml").write_text(broken)
    assert run(promtool, "check", "rules", tmp_path / "gpuq-alerts.yml").returncode != 0
    quiet = RULES.read_text().replace("gpuq_redis_up == 0", "gpuq_redis_up == 2")
    (tmp_path / "gpuq-alerts.yml").write_text(quiet)
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    failed = run(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert failed.returncode != 0 and "GpuqRedisDown" in failed.stdout + failed.stderr


def test_every_alert_says_how_bad_it_is_and_where_the_runbook_is():
    operations = (ROOT / "docs" / "operations.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", operations, re.M)
    }
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        path, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert path == "docs/operations.md" and anchor in anchors, rule["alert"]


def test_the_dashboard_queries_are_valid_promql(promtool, tmp_path):
    queries = dashboard_queries()
    assert len(queries) >= 15
    rules = []
    for i, query in enumerate(queries):
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        assert "$" not in query, f"a Grafana variable this test does not know: {query}"
        rules.append({"record": f"dashboard:query_{i}", "expr": query})
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = run(promtool, "check", "rules", tmp_path / "dashboard.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_reads_its_prometheus_from_a_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for p in panels)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
