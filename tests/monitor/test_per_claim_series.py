"""The series each claim puts on /metrics are those docs/monitoring.md lists ("Per-claim series"): a node's
page grows by that many per claim, not by every figure the monitor knows."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from monitor_harness import bare_monitor
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from repo_paths import ROOT

from dra_gpu.config import WatchdogPolicy
from dra_gpu.monitor import Monitor, MonitorCollector
from dra_gpu.monitor.compute_hold import Account
from dra_gpu.monitor.elastic import ElasticFigures
from dra_gpu.monitor.monitor import ClaimFigures, Held, Snapshot
from dra_gpu.monitor.watchdog import ClaimRef

CLAIMS = 200
GiB = 1 << 30
ROW = re.compile(r"^\| `(dra_gpu_[a-z_]+)`(?:, `(dra_gpu_[a-z_]+)`)? \| (.+) \|$")


def documented() -> dict[str, str]:
    """Each per-claim series of docs/monitoring.md's table, with when a claim has it."""
    text = (ROOT / "docs" / "monitoring.md").read_text()
    section = text.split("### Per-claim series", 1)[1].split("\n#", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            for name in match.group(1, 2):
                if name:
                    rows[name] = match.group(3)
    assert rows, "docs/monitoring.md has a table of the per-claim series"
    return rows


def idle_claim(i: int) -> ClaimFigures:
    """A prepared Limiter claim of 1 % on its GPU's board whose processes have not run yet."""
    held = Held(
        ClaimRef(f"uid-{i}", "team", f"claim-{i}"),
        f"GPU-{i % 8:08x}-0000-4000-8000-000000000000",
        "Limiter",
        GiB,
        1,
        WatchdogPolicy.REPORT,
    )
    return ClaimFigures(held, elastic=ElasticFigures(1, 100, "standard", 0.0, 0.0, 0.0, 0, 0.0))


def page(monitor: Monitor) -> Counter[str]:
    """The series of /metrics that name a claim, by family."""
    registry = CollectorRegistry()
    registry.register(MonitorCollector(monitor))
    text = generate_latest(registry).decode()
    return Counter(
        s.name for f in text_string_to_metric_families(text) for s in f.samples if "claim" in s.labels
    )


def test_a_claim_has_the_documented_series_and_more_only_once_they_count(tmp_path: Path) -> None:
    docs = documented()
    always = {name for name, when in docs.items() if when == "always"}
    once_run = {name for name, when in docs.items() if "used the GPU" in when}
    assert always and once_run
    monitor = bare_monitor(tmp_path)
    snap = Snapshot()
    for i in range(CLAIMS):
        fig = idle_claim(i)
        snap.claims[(fig.held.claim.uid, fig.held.gpu)] = fig
        monitor.hold.accounts[(fig.held.claim.uid, fig.held.gpu)] = Account()  # never frozen
    monitor.snapshot = snap

    # Nothing of them ran: the documented "always" series, per claim, and nothing else.
    assert page(monitor) == Counter(dict.fromkeys(always, CLAIMS))

    # Their processes ran (the region counts memory, busy and throttled time; nothing refused, borrowed or lent).
    for fig in snap.claims.values():
        fig.memory_used, fig.throttled_seconds, fig.refused, fig.busy_seconds = GiB, 0.5, 0, 2.0
    assert page(monitor) == Counter(dict.fromkeys(always | once_run, CLAIMS))

    # One claim borrowed, was refused an allocation and was frozen: its counters join, one series each.
    key, fig = next(iter(snap.claims.items()))
    assert fig.elastic is not None
    fig.elastic = ElasticFigures(1, 100, "standard", 3.0, 2.0, 0.0, 0, 0.0)
    fig.refused = 1
    monitor.hold.accounts[key] = Account(frozen_seconds=1.5, freezes=1)
    grown = page(monitor) - Counter(dict.fromkeys(always | once_run, CLAIMS))
    assert grown == Counter(
        dict.fromkeys(
            [
                "dra_gpu_claim_compute_used_seconds_total",
                "dra_gpu_claim_compute_borrowed_seconds_total",
                "dra_gpu_claim_allocations_refused_total",
                "dra_gpu_claim_compute_frozen_seconds_total",
                "dra_gpu_claim_compute_freezes_total",
            ],
            1,
        )
    )
    assert set(grown) <= set(docs), "each is in the documented table"
