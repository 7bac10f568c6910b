"""Prometheus metrics of the node agent, in a registry of its own (several agents may share a process)."""

from __future__ import annotations

import contextlib
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dra_gpu import __version__
from dra_gpu.plugin.checkpoint import Checkpoint, ClaimState, PreparedClaim

ShareKey = tuple[str, str, str]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.prepare_seconds = Histogram(
            "dra_gpu_prepare_duration_seconds",
            "Time to answer one NodePrepareResources call (all claims of a pod).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.unprepare_seconds = Histogram(
            "dra_gpu_unprepare_duration_seconds",
            "Time to answer one NodeUnprepareResources call.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "dra_gpu_claim_errors",
            "Claims whose prepare or unprepare failed, by operation and reason.",
            ["operation", "reason"],
            registry=r,
        )
        self.prepared_claims = Gauge(
            "dra_gpu_prepared_claims",
            "Claims prepared on this node (checkpoint state PrepareCompleted).",
            registry=r,
        )
        self.gpu_shares = Gauge(
            "dra_gpu_gpu_shares",
            "Prepared shares per GPU and sharing strategy.",
            ["device", "gpu_uuid", "strategy"],
            registry=r,
        )
        self.setup_repairs = Counter(
            "dra_gpu_setup_repairs",
            "Node-side setup found gone and re-applied (e.g. a restarted MPS control daemon), by kind.",
            ["kind"],
            registry=r,
        )
        self.registered = Gauge(
            "dra_gpu_plugin_registered", "1 once the kubelet accepted the plugin's registration.", registry=r
        )
        self.stale_uncleaned = Gauge(
            "dra_gpu_stale_claims_uncleaned",
            "Records of stale claims the last sweep could not undo (each logged; the next sweep retries).",
            registry=r,
        )
        self.build_info = Gauge(
            "dra_gpu_build_info",
            "Always 1; its label is the release of the agent answering (two during a rolling update).",
            ["version"],
            registry=r,
        )
        self.build_info.labels(version=__version__).set(1)
        self.publishing = Gauge(
            "dra_gpu_publishing_slices",
            "1 while this agent publishes the node's ResourceSlices (one agent of a node at a time).",
            registry=r,
        )
        self._lock = threading.Lock()
        self._completed = 0
        self._counts: dict[ShareKey, int] = {}

    def refresh(self, checkpoint: Checkpoint) -> None:
        """Recompute the gauges from the checkpoint, the one source of truth."""
        with self._lock:
            self._completed = 0
            self._counts = {}
            self.gpu_shares.clear()
            for claim in list(checkpoint.claims.values()):
                self._count(claim, 1)

    def claim_changed(self, before: PreparedClaim | None, after: PreparedClaim | None) -> None:
        """Follow one record's change (work per claim, not per node)."""
        with self._lock:
            if before is not None:
                self._count(before, -1)
            if after is not None:
                self._count(after, 1)

    def _count(self, claim: PreparedClaim, step: int) -> None:
        if claim.state != ClaimState.PREPARE_COMPLETED:
            return
        self._completed += step
        self.prepared_claims.set(self._completed)
        for share in claim.shares:
            key = (share.device, share.gpu, share.strategy)
            count = self._counts.get(key, 0) + step
            device, gpu, strategy = key
            if count > 0:
                self._counts[key] = count
                self.gpu_shares.labels(device=device, gpu_uuid=gpu, strategy=strategy).set(count)
            else:
                self._counts.pop(key, None)
                with contextlib.suppress(KeyError):
                    self.gpu_shares.remove(device, gpu, strategy)
