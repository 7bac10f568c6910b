"""The Grafana dashboard in deploy/ loads, and every query names a metric the node agent exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from monitor_harness import bare_monitor
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from repo_paths import ROOT

from dra_gpu.config import WatchdogPolicy
from dra_gpu.monitor import METRICS, Monitor, MonitorCollector
from dra_gpu.monitor.compute_hold import Account
from dra_gpu.monitor.elastic import ElasticFigures
from dra_gpu.monitor.monitor import ClaimFigures, ContainerFigures, Held, Snapshot
from dra_gpu.monitor.pods import PodInfo
from dra_gpu.monitor.watchdog import ClaimRef, Reason, Violation

DEPLOY = ROOT / "deploy"
METRIC = re.compile(r"\b(dra_gpu_[a-z_]+)\b")


def _dashboard() -> dict[str, Any]:
    config_map = yaml.safe_load((DEPLOY / "grafana-dashboard.yaml").read_text())
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    return json.loads(config_map["data"]["dra-gpu.json"])


def _queries(dashboard: dict[str, Any]) -> list[str]:
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return queries


def _names(monitor: Monitor) -> set[str]:
    registry = CollectorRegistry()
    registry.register(MonitorCollector(monitor))
    text = generate_latest(registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def _exported(tmp_path: Path) -> set[str]:
    """The metric names a monitor with one claim, two containers and one violation puts on /metrics."""
    monitor = bare_monitor(tmp_path)
    held = Held(ClaimRef("u", "ns", "c"), "GPU-1", "Limiter", 1, 50, WatchdogPolicy.REPORT)
    snap = Snapshot()
    elastic = ElasticFigures(50, 100, "latency", 1.0, 0.5, 0.1, 0, 0.2)
    snap.claims[("u", "GPU-1")] = ClaimFigures(
        held, memory_used=1, busy_seconds=2.0, throttled_seconds=0.5, refused=2, elastic=elastic
    )
    snap.containers[("u", "p", "main", "GPU-1")] = (held, ContainerFigures(1, 1.0))
    snap.containers[("u", "p", "side", "GPU-1")] = (held, ContainerFigures(1, 1.0))
    monitor.snapshot = snap
    pod = PodInfo("pu", "ns", "p", {}, frozenset({"c"}))
    violation = Violation(Reason.MEMORY, 1, "GPU-1", held.claim, pod, "main", WatchdogPolicy.REPORT, "")
    monitor.watchdog.active = [violation]
    monitor.watchdog.violations_total[("ns", "c", "p", "GPU-1", "MemoryOverLimit")] = 1
    monitor.watchdog.terminated_total[("ns", "c", "p", "GPU-1", "MemoryOverLimit")] = 1
    monitor.slots_reclaimed[("ns", "c")] = 1
    monitor.hold.accounts[("u", "GPU-1")] = Account(frozen_seconds=1.0, freezes=1)
    monitor.contradicted[("u", "GPU-1")] = 0.0
    return _names(monitor)


def test_the_exported_names_are_the_documented_ones(tmp_path: Path) -> None:
    assert _exported(tmp_path) == set(METRICS)


def test_every_dashboard_query_names_an_exported_metric(tmp_path: Path) -> None:
    dashboard = _dashboard()
    exported = _exported(tmp_path)
    queries = _queries(dashboard)
    assert len(dashboard["panels"]) >= 6 and queries
    for query in queries:
        names = METRIC.findall(query)
        assert names, f"query names no metric: {query}"
        for name in names:
            assert name in exported, f"{name} in {query!r} is not a metric the agent exports"
    used = {name for q in queries for name in METRIC.findall(q)}
    wanted = {
        "dra_gpu_claim_memory_used_bytes",
        "dra_gpu_claim_memory_limit_bytes",
        "dra_gpu_claim_throttled_seconds_total",
        "dra_gpu_claim_allocations_refused_total",
        "dra_gpu_watchdog_violations_total",
        "dra_gpu_claim_compute_used_seconds_total",
        "dra_gpu_claim_compute_borrowed_seconds_total",
        "dra_gpu_claim_compute_lent_seconds_total",
    }
    assert wanted <= used, (
        "usage against share, throttling, refusals, watchdog events and elastic compute are shown"
    )


def test_panels_have_unique_ids_and_positions() -> None:
    panels = _dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert len({(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels}) == len(panels)


def test_the_claim_selectors_list_a_claim_from_its_prepare_on(tmp_path: Path) -> None:
    """A claim's series that count events appear once they count: the namespace and claim variables read a
    series every prepared claim has, so a claim nothing has happened to yet can be picked too."""
    monitor = bare_monitor(tmp_path)
    held = Held(ClaimRef("u", "ns", "c"), "GPU-1", "Limiter", 1, 50, WatchdogPolicy.REPORT)
    snap = Snapshot()
    snap.claims[("u", "GPU-1")] = ClaimFigures(
        held, elastic=ElasticFigures(50, 100, "latency", 0, 0, 0, 0, 0)
    )
    monitor.snapshot = snap
    idle = _names(monitor)
    variables = [v for v in _dashboard()["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in variables} == {"namespace", "claim"}
    for variable in variables:
        for name in METRIC.findall(variable["definition"]):
            assert name in idle, f"{name} of variable {variable['name']} is not on the page of an idle claim"
