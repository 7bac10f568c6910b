"""Use beside allocation: the node agents' /metrics, read and folded into per-claim, per-GPU figures.

The agents' series are keyed by namespace, claim and GPU UUID (unique in the cluster), so figures from
every agent merge without knowing which node answered. An agent that cannot be reached costs only its
own figures: `dra-gpu usage` then shows allocations alone for its GPUs and says so.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

AGENT_SELECTOR = "app.kubernetes.io/name=dra-gpu,app.kubernetes.io/component=kubelet-plugin"
AGENT_NAMESPACE = "dra-gpu-node"
"""Where the install puts the agents (values `kubeletPlugin.namespace`; a manifests test compares them)."""

Key = tuple[str, str, str]
"""(namespace, claim, GPU UUID)."""


@dataclass
class ClaimUse:
    memory_used: float | None = None
    memory_limit: float | None = None
    busy_seconds: float | None = None
    throttled_seconds: float | None = None
    refused: float | None = None
    violations: float = 0.0
    compute_used_seconds: float | None = None
    """Elastic compute: GPU time used and borrowed above the floor (what the claim's own processes report)
    and lent; None where the agent has no series, which it has only once they count (None is 0 s for a
    claim on a board). The floor, ceiling and priority are the claim's configuration (`Holder.compute`)."""
    compute_borrowed_seconds: float | None = None
    compute_lent_seconds: float | None = None


@dataclass
class LiveUsage:
    claims: dict[Key, ClaimUse] = field(default_factory=dict)
    reached: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    """Agent -> why it could not be read."""

    def get(self, namespace: str, claim: str, gpu: str) -> ClaimUse | None:
        return self.claims.get((namespace, claim, gpu))


_FIELDS = {
    "dra_gpu_claim_memory_used_bytes": "memory_used",
    "dra_gpu_claim_memory_limit_bytes": "memory_limit",
    "dra_gpu_claim_compute_busy_seconds_total": "busy_seconds",
    "dra_gpu_claim_throttled_seconds_total": "throttled_seconds",
    "dra_gpu_claim_allocations_refused_total": "refused",
    "dra_gpu_claim_compute_used_seconds_total": "compute_used_seconds",
    "dra_gpu_claim_compute_borrowed_seconds_total": "compute_borrowed_seconds",
    "dra_gpu_claim_compute_lent_seconds_total": "compute_lent_seconds",
}


def parse_metrics(text: str, into: LiveUsage | None = None) -> LiveUsage:
    """Fold one agent's /metrics text into `into` (a new LiveUsage by default)."""
    live = into if into is not None else LiveUsage()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            key = (labels.get("namespace", ""), labels.get("claim", ""), labels.get("gpu_uuid", ""))
            if sample.name in _FIELDS:
                setattr(live.claims.setdefault(key, ClaimUse()), _FIELDS[sample.name], sample.value)
            elif sample.name == "dra_gpu_watchdog_violations_total":
                use = live.claims.setdefault(key, ClaimUse())
                use.violations += sample.value
    return live


Fetch = Callable[[str], str]
"""Reads one agent's /metrics (the agent's name or URL -> text); raises OSError or ValueError."""


def read_agents(agents: Iterable[str], fetch: Fetch) -> LiveUsage:
    live = LiveUsage()
    for agent in agents:
        try:
            parse_metrics(fetch(agent), live)
        except Exception as exc:  # any failure of one agent leaves the others' figures
            live.unreachable[agent] = " ".join(str(exc).split()) or type(exc).__name__
            continue
        live.reached.append(agent)
    return live


def fetch_url(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode("utf-8", "replace"))
