"""Reading Prometheus text exposition in tests, with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample as {(name, labels): value}; parsing fails loudly on invalid exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(parsed: dict, name: str, /, **labels: str) -> float | None:
    return parsed.get((name, frozenset(labels.items())))


def total(parsed: dict, name: str, /, **labels: str) -> float:
    """Sum over the series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in parsed.items() if n == name and want <= ls)
