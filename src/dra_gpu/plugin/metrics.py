"""Prometheus metrics of the node agent, in a registry of its own (several agents may share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dra_gpu.plugin.checkpoint import Checkpoint, ClaimState

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

    def refresh(self, checkpoint: Checkpoint) -> None:
        """Recompute the gauges from the checkpoint, the one source of truth."""
        completed = [c for c in checkpoint.claims.values() if c.state == ClaimState.PREPARE_COMPLETED]
        self.prepared_claims.set(len(completed))
        counts: dict[tuple[str, str, str], int] = {}
        for claim in completed:
            for share in claim.shares:
                key = (share.device, share.gpu, share.strategy)
                counts[key] = counts.get(key, 0) + 1
        self.gpu_shares.clear()
        for (device, gpu, strategy), count in counts.items():
            self.gpu_shares.labels(device=device, gpu_uuid=gpu, strategy=strategy).set(count)
