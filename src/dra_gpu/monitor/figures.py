"""What the usage monitor works on and hands out: the claims prepared on this node, as it sees them
(`ClaimHoldings`, `Held`, looked up through `ClaimsView`), and what it found them using (`Snapshot`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dra_gpu.config import Strategy, WatchdogPolicy
from dra_gpu.monitor.elastic import ElasticFigures
from dra_gpu.monitor.watchdog import ClaimRef

LIMITER = Strategy.LIMITER.value


@dataclass(frozen=True)
class Held:
    """What one claim holds of one GPU (several shares of a GPU in one claim add up)."""

    claim: ClaimRef
    gpu: str
    sharing: str
    memory_limit: int | None
    cores: int | None
    policy: WatchdogPolicy | None
    """None: the class set none, and the node's default holds (a limiter claim's caps enforced, the rest
    reported)."""

    def enforced(self) -> bool:
        """Whether the node takes back memory over this share's cap (and throttles compute over its ceiling)."""
        if self.policy is None:
            return self.sharing == LIMITER
        return self.policy == WatchdogPolicy.TERMINATE

    def acts(self) -> WatchdogPolicy:
        """The policy for what is not over a cap (LimiterMissing, GpuNotAllocated): Terminate only if asked."""
        return WatchdogPolicy.TERMINATE if self.policy == WatchdogPolicy.TERMINATE else WatchdogPolicy.REPORT


@dataclass
class ClaimFigures:
    held: Held
    memory_used: int | None = None
    busy_seconds: float = 0.0
    throttled_seconds: float | None = None
    """None without a limiter region: nothing throttles or refuses for the claim."""
    refused: int | None = None
    elastic: ElasticFigures | None = None
    """None unless the claim is on its GPU's arbitration board (a limiter share below 100 %)."""


@dataclass
class ContainerFigures:
    memory_used: int = 0
    busy_seconds: float = 0.0


@dataclass
class Snapshot:
    claims: dict[tuple[str, str], ClaimFigures] = field(default_factory=dict)
    """(claim uid, gpu) -> figures."""
    containers: dict[tuple[str, str, str, str], tuple[Held, ContainerFigures]] = field(default_factory=dict)
    """(claim uid, pod name, container, gpu) -> figures."""


@dataclass(frozen=True)
class ClaimHoldings:
    """A claim prepared on this node, as the monitor sees it: which claim, and what it holds of each GPU."""

    claim: ClaimRef
    held: tuple[Held, ...]


PreparedClaims = Callable[[], list[ClaimHoldings]]
"""What the node agent hands the monitor: the claims prepared on this node now (the plugin's records,
read through `dra_gpu.plugin.holdings`), so that the monitor needs nothing of the plugin's."""


class ClaimsView:
    """The claims prepared, as each pass looks them up (made again only when they change)."""

    def __init__(self, prepared: list[ClaimHoldings]) -> None:
        self.prepared = prepared
        self.held = {(h.claim.uid, h.gpu): h for c in prepared for h in c.held}
        self.held_by_claim = {c.claim.uid: c.held for c in prepared}
        self.by_name = {(c.claim.namespace, c.claim.name): c.claim for c in prepared}
        self.ours = {gpu for _, gpu in self.held}
        """The GPUs this driver holds claims on: a GPU of another allocator (the device plugin, say) is not
        ours to judge."""
        self.limited = {key: h for key, h in self.held.items() if h.sharing == LIMITER}
        """The shares under the limiter: those with a region, a floor file and an activity file."""
        self.limited_claims = sorted({h.claim.uid for h in self.limited.values()})
