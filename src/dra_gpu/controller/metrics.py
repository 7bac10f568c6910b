"""Prometheus metrics of the controller, in a registry of its own so two controllers can share a process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "dra_gpu_controller"


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.allocations = Counter(
            f"{PREFIX}_allocations", "Claims the controller allocated", registry=self.registry
        )
        self.failures = Counter(
            f"{PREFIX}_allocation_failures",
            "Allocation attempts that failed, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.time_to_allocate = Histogram(
            f"{PREFIX}_time_to_allocate_seconds",
            "From the moment the controller first saw a claim waiting (with a consumer) to its allocation",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
            registry=self.registry,
        )
        self.releases = Counter(
            f"{PREFIX}_releases", "Allocations the controller released", registry=self.registry
        )
        self.conflicts = Counter(
            f"{PREFIX}_conflicts", "409 conflicts re-read and retried", registry=self.registry
        )
        self.pending = Gauge(
            f"{PREFIX}_pending_claims",
            "Controller-managed claims with a consumer still waiting for an allocation",
            registry=self.registry,
        )
        self.leader = Gauge(
            f"{PREFIX}_is_leader", "1 while this replica holds the leader lease", registry=self.registry
        )
