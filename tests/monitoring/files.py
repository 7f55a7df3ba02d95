"""The files in monitoring/, read as the tests need them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

MONITORING = Path(__file__).parents[2] / "monitoring"
RULES = MONITORING / "gpuq-alerts.yml"
RULE_TESTS = MONITORING / "gpuq-alerts.test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[str]:
    """Every panel target's PromQL, as written (with Grafana's variables)."""

    def walk(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node["expr"]] if isinstance(node.get("expr"), str) else []
            return found + [e for v in node.values() for e in walk(v)]
        return [e for v in node for e in walk(v)] if isinstance(node, list) else []

    return walk(json.loads(DASHBOARD.read_text()))
