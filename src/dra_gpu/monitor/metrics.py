"""The monitor's Prometheus series, built at scrape time from the latest snapshot.

Series exist only for prepared claims: when a claim is unprepared its series are gone at the next
sampling, which bounds the label cardinality by what the node holds. `METRICS` is the one list of
names (the dashboard test checks every query against it).

A claim has a series only where it carries a figure someone acts on (docs/monitoring.md, "Per-claim
series"): its memory limit (the one setting alerts compare a figure with) and memory in use, and each
of its counters (GPU time busy, time throttled, allocations refused, elastic time used, borrowed, lent
and held, freezes) once it counts, as the watchdog's do: an idle claim's zeros say nothing. A claim's
compute share, floor, ceiling and priority are its configuration: the claim says them (`dra-gpu usage`
shows them), and 2,000 claims would spend 1.2 MB of every scrape repeating them. Its sharing mode is a
label of its memory limit alone (the series every claim has): on every other family it repeated what
namespace, claim and GPU already name. A claim's container series exist where its processes on a GPU are
in more than one container: with one, that container's figures are the claim's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from dra_gpu.monitor.compute_hold import ComputeHold
from dra_gpu.monitor.monitor import ClaimFigures, Held, Monitor, Snapshot

CLAIM_LABELS = ["namespace", "claim", "gpu_uuid"]
LIMIT_LABELS = [*CLAIM_LABELS, "sharing"]
"""The memory limit, every claim's series, also names the claim's sharing mode (join on the claim's
labels for it)."""
CONTAINER_LABELS = ["namespace", "claim", "pod", "container", "gpu_uuid"]
WATCHDOG_LABELS = ["namespace", "claim", "pod", "gpu_uuid", "reason"]

METRICS = {
    "dra_gpu_claim_memory_used_bytes": "GPU memory in use by the claim's processes on the GPU.",
    "dra_gpu_claim_memory_limit_bytes": "GPU memory the claim holds on the GPU (its share, or the whole GPU).",
    "dra_gpu_claim_compute_busy_seconds_total": "GPU time the claim's processes kept the GPU busy (from the "
    "first busy time on).",
    "dra_gpu_claim_throttled_seconds_total": "Time the claim's launching threads waited in the limiter (from "
    "the first wait on).",
    "dra_gpu_claim_allocations_refused_total": "Allocations the limiter refused for the claim's memory limit "
    "(from the first refusal on).",
    "dra_gpu_container_memory_used_bytes": "GPU memory in use by one container of a claim, from NVML (for "
    "claims whose processes on the GPU are in more than one container).",
    "dra_gpu_container_compute_busy_seconds_total": "GPU time one container of a claim kept the GPU busy (for "
    "claims whose processes on the GPU are in more than one container; from the first busy time on).",
    "dra_gpu_claim_compute_used_seconds_total": "GPU time the claim's processes report charged to it on the GPU "
    "(the claim's own word; from its first report of use on).",
    "dra_gpu_claim_compute_borrowed_seconds_total": "Part of the used time the claim reports admitted above its "
    "floor (the claim's own word; from the first time it borrowed on).",
    "dra_gpu_claim_compute_lent_seconds_total": "Floor time the claim left idle while other claims on the GPU "
    "borrowed (from the claims' reports; from the first time it lent on).",
    "dra_gpu_claim_compute_held_seconds_total": "Time the claim reports its launches waited because a latency "
    "claim was active (the claim's own word; from the first time it was held on).",
    "dra_gpu_claim_slots_reclaimed_total": "Limiter region slots of the claim the agent handed back because "
    "their process was gone (a process of another PID namespace, which the claim's own processes cannot see).",
    "dra_gpu_watchdog_violations_total": "Processes found escaping their claim's share, by reason.",
    "dra_gpu_watchdog_terminations_total": "Processes the watchdog terminated (policy Terminate).",
    "dra_gpu_watchdog_violating_processes": "Processes escaping their claim's share at the last sampling.",
    "dra_gpu_monitor_samples_total": "Samplings the usage monitor has completed.",
    "dra_gpu_claim_compute_frozen_seconds_total": "Time the node kept the claim's containers frozen because its "
    "GPU time by NVML was over its ceiling (from the first freeze on).",
    "dra_gpu_claim_compute_freezes_total": "Freezes of the claim's containers for GPU time over its ceiling "
    "(from the first freeze on).",
    "dra_gpu_claim_activity_contradicted": "1 while the claim's activity file says it wants the GPU and the "
    "driver saw its processes run nothing there.",
}


def _name(metric: str) -> str:
    """prometheus_client adds `_total` to counters itself."""
    return metric.removesuffix("_total")


class _Samples:
    """A family's samples, each made as the exposition reads it and dropped once written: a scrape of
    thousands of claims holds two lists, not a tuple per series that the collector of cycles has to walk."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.labels: list[dict[str, str]] = []
        self.values: list[float] = []

    def __iter__(self) -> Iterator[Sample]:
        name = self.name
        for labels, value in zip(self.labels, self.values, strict=True):
            yield Sample(name, labels, value)

    def __len__(self) -> int:
        return len(self.values)


def _family(kind: type[GaugeMetricFamily | CounterMetricFamily], metric: str, labels: list[str]) -> Metric:
    family = kind(_name(metric), METRICS[metric], labels=labels)
    family.samples = _Samples(metric)  # type: ignore[assignment]
    return family


def _add(family: Metric, labels: dict[str, str], value: float) -> None:
    """`add_metric` with a label set made once: the series of one claim share it (the exposition only reads
    it), so a scrape of thousands of claims makes no dict per series."""
    samples = family.samples
    assert isinstance(samples, _Samples)
    samples.labels.append(labels)
    samples.values.append(value)


def _add_counting(labels: dict[str, str], *counters: tuple[Metric, float | None]) -> None:
    """Each counter under `labels` once it counts: a claim's idle zeros carry no figure."""
    for family, value in counters:
        if value:
            _add(family, labels, value)


class MonitorCollector(Collector):
    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor
        self._labels: dict[Held, tuple[dict[str, str], dict[str, str]]] = {}
        """Each held share's label sets (its claim's, its memory limit's), made once while it is held: every
        series of a claim shares them, and a scrape of thousands of claims makes none."""

    def _claim_labels(self, figures: list[ClaimFigures]) -> dict[Held, tuple[dict[str, str], dict[str, str]]]:
        old, new = self._labels, {}
        for fig in figures:
            h = fig.held
            pair = old.get(h)
            if pair is None:
                claim = {"namespace": h.claim.namespace, "claim": h.claim.name, "gpu_uuid": h.gpu}
                pair = (claim, {**claim, "sharing": h.sharing})
            new[h] = pair
        self._labels = new
        return new

    def collect(self) -> Iterator[Metric]:
        m = METRICS
        snap = self._monitor.snapshot
        used = _family(GaugeMetricFamily, "dra_gpu_claim_memory_used_bytes", CLAIM_LABELS)
        limit = _family(GaugeMetricFamily, "dra_gpu_claim_memory_limit_bytes", LIMIT_LABELS)
        busy = _family(CounterMetricFamily, "dra_gpu_claim_compute_busy_seconds_total", CLAIM_LABELS)
        throttled = _family(CounterMetricFamily, "dra_gpu_claim_throttled_seconds_total", CLAIM_LABELS)
        refused = _family(CounterMetricFamily, "dra_gpu_claim_allocations_refused_total", CLAIM_LABELS)
        figures = list(snap.claims.values())
        label_sets = self._claim_labels(figures)
        for fig in figures:
            h = fig.held
            labels, limit_labels = label_sets[h]
            if fig.memory_used is not None:
                _add(used, labels, fig.memory_used)
            if h.memory_limit is not None:
                _add(limit, limit_labels, h.memory_limit)
            _add_counting(
                labels, (busy, fig.busy_seconds), (throttled, fig.throttled_seconds), (refused, fig.refused)
            )
        c_used = GaugeMetricFamily(
            "dra_gpu_container_memory_used_bytes",
            m["dra_gpu_container_memory_used_bytes"],
            labels=CONTAINER_LABELS,
        )
        c_busy = CounterMetricFamily(
            _name("dra_gpu_container_compute_busy_seconds_total"),
            m["dra_gpu_container_compute_busy_seconds_total"],
            labels=CONTAINER_LABELS,
        )
        containers = list(snap.containers.items())
        # A claim's processes on a GPU in one container: that container's figures are the claim's series.
        seen = Counter((uid, gpu) for (uid, _, _, gpu), _ in containers)
        for (uid, pod, container, gpu), (h, cfig) in containers:
            if seen[(uid, gpu)] < 2:
                continue
            names = [h.claim.namespace, h.claim.name, pod, container, gpu]
            c_used.add_metric(names, cfig.memory_used)
            if cfig.busy_seconds:
                c_busy.add_metric(names, cfig.busy_seconds)
        reclaimed = CounterMetricFamily(
            _name("dra_gpu_claim_slots_reclaimed_total"),
            m["dra_gpu_claim_slots_reclaimed_total"],
            labels=["namespace", "claim"],
        )
        for (namespace, claim), count in list(self._monitor.slots_reclaimed.items()):
            reclaimed.add_metric([namespace, claim], count)
        yield from (used, limit, busy, throttled, refused, c_used, c_busy, reclaimed)
        yield from elastic_families(figures, {h: pair[0] for h, pair in label_sets.items()})

        wd = self._monitor.watchdog
        violations = CounterMetricFamily(
            _name("dra_gpu_watchdog_violations_total"),
            m["dra_gpu_watchdog_violations_total"],
            labels=WATCHDOG_LABELS,
        )
        for key, count in list(wd.violations_total.items()):  # the monitor thread adds
            violations.add_metric(list(key), count)
        terminations = CounterMetricFamily(
            _name("dra_gpu_watchdog_terminations_total"),
            m["dra_gpu_watchdog_terminations_total"],
            labels=WATCHDOG_LABELS,
        )
        for key, count in list(wd.terminated_total.items()):
            terminations.add_metric(list(key), count)
        active = GaugeMetricFamily(
            "dra_gpu_watchdog_violating_processes",
            m["dra_gpu_watchdog_violating_processes"],
            labels=WATCHDOG_LABELS,
        )
        counts: dict[tuple[str, str, str, str, str], int] = {}
        for v in list(wd.active):
            active_key = (v.claim.namespace, v.claim.name, v.pod.name, v.gpu, v.reason.value)
            counts[active_key] = counts.get(active_key, 0) + 1
        for active_key, n in counts.items():
            active.add_metric(list(active_key), n)
        samples = CounterMetricFamily(
            _name("dra_gpu_monitor_samples_total"), m["dra_gpu_monitor_samples_total"]
        )
        samples.add_metric([], self._monitor.samples)
        yield from (violations, terminations, active, samples)
        yield from hold_families(self._monitor.hold, snap)
        yield from activity_families(self._monitor, snap)


def hold_families(hold: ComputeHold, snap: Snapshot) -> Iterator[Metric]:
    """The node's compute hold: how long and how often each claim's containers were frozen, for the claims
    it froze at least once."""
    m = METRICS
    labels = ["namespace", "claim", "gpu_uuid"]
    frozen = CounterMetricFamily(
        _name("dra_gpu_claim_compute_frozen_seconds_total"),
        m["dra_gpu_claim_compute_frozen_seconds_total"],
        labels=labels,
    )
    freezes = CounterMetricFamily(
        _name("dra_gpu_claim_compute_freezes_total"), m["dra_gpu_claim_compute_freezes_total"], labels=labels
    )
    for key, account in list(hold.accounts.items()):
        fig = snap.claims.get(key)
        if fig is None or not account.freezes:  # from the first freeze on: an honest claim has none
            continue
        names = [fig.held.claim.namespace, fig.held.claim.name, key[1]]
        frozen.add_metric(names, account.frozen_seconds)
        freezes.add_metric(names, account.freezes)
    yield from (frozen, freezes)


def activity_families(monitor: Monitor, snap: Snapshot) -> Iterator[Metric]:
    """The claims whose word about their activity the driver's figures contradict now."""
    contradicted = GaugeMetricFamily(
        "dra_gpu_claim_activity_contradicted",
        METRICS["dra_gpu_claim_activity_contradicted"],
        labels=["namespace", "claim", "gpu_uuid"],
    )
    for key in monitor.idle_by_driver():
        fig = snap.claims.get(key)
        if fig is not None:
            contradicted.add_metric([fig.held.claim.namespace, fig.held.claim.name, key[1]], 1)
    yield contradicted


ELASTIC_COUNTERS = (
    "dra_gpu_claim_compute_used_seconds_total",
    "dra_gpu_claim_compute_borrowed_seconds_total",
    "dra_gpu_claim_compute_lent_seconds_total",
    "dra_gpu_claim_compute_held_seconds_total",
)


def elastic_families(
    figures: list[ClaimFigures], label_sets: dict[Held, dict[str, str]] | None = None
) -> Iterator[Metric]:
    """Elastic compute: the GPU time each claim on a board reports used, borrowed and held, and what it lent.

    Each appears once it counts (a claim that never borrowed has no borrowed series: it borrowed 0 s). The
    floor, ceiling and priority are the claim's configuration, not series."""
    counters = {name: _family(CounterMetricFamily, name, CLAIM_LABELS) for name in ELASTIC_COUNTERS}
    used, borrowed, lent, held = counters.values()
    for fig in figures:
        e, h = fig.elastic, fig.held
        if e is None:
            continue
        labels = label_sets.get(h) if label_sets is not None else None
        if labels is None:
            labels = {"namespace": h.claim.namespace, "claim": h.claim.name, "gpu_uuid": h.gpu}
        _add_counting(
            labels,
            (used, e.used_seconds),
            (borrowed, e.borrowed_seconds),
            (lent, e.lent_seconds),
            (held, e.held_seconds),
        )
    yield from counters.values()
