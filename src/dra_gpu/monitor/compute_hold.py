"""The node holds a claim's GPU time to its ceiling, from the driver's figures, with the kernel's freezer.

Each enforced claim has, per GPU, an account of GPU seconds (a token bucket): it earns its ceiling plus
MARGIN for every second of wall time, spends what NVML's per-process utilization says its processes ran,
and holds at most BURST_S ahead. A claim in debt has the cgroups of its GPU processes' containers frozen
until what it earns while frozen repays the debt - at most MAX_FREEZE_S at a time, then thawed for at least
MIN_RUN_S - so its long-run share comes back to its ceiling plus the margin, and what it took beyond is
given back. An honest claim (the limiter holds it at its ceiling) never goes into debt: the margin is above
what the driver's sampling and the limiter's own pacing put on top of the ceiling.

While a claim is frozen, nothing in its containers runs: probes and `kubectl exec` wait for the thaw (at
most MAX_FREEZE_S), SIGTERM is delivered when it thaws (cgroup v2 lets SIGKILL through at once). A claim
that goes away (unprepared, its processes gone) and an agent that stops thaw what they froze. Each cgroup is
recorded in the agent's state directory before it is frozen (`FreezeRecords`): an agent killed mid-freeze
leaves the record, and the next agent thaws it when it starts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from dra_gpu.monitor.freezer import CgroupFreezer, FreezeError, FreezeRecords

log = logging.getLogger(__name__)

MARGIN = 0.02
"""What a claim may run above its ceiling, as a fraction of the GPU (2 points)."""
BURST_S = 0.2
"""GPU seconds a claim may run ahead of its account: 2 points of a 10 s window."""
MAX_FREEZE_S = 2.0
"""The longest one freeze lasts: a probe with a timeout above it, or a retried one, still succeeds."""
MIN_RUN_S = 0.25
"""The shortest run between two freezes."""

Key = tuple[str, str]
"""(claim uid, GPU UUID)."""


@dataclass
class Account:
    balance: float = BURST_S
    fed_at: float | None = None
    frozen_at: float = 0.0
    frozen_until: float | None = None
    run_until: float = 0.0
    freezers: set[CgroupFreezer] = field(default_factory=set)
    frozen_seconds: float = 0.0
    freezes: int = 0


class ComputeHold:
    """Accounts, freezes and thaws. `freezer_of(pid)`: the freezer of a host process's container cgroup."""

    def __init__(
        self,
        freezer_of: Callable[[int], CgroupFreezer | None],
        margin: float = MARGIN,
        burst_s: float = BURST_S,
        max_freeze_s: float = MAX_FREEZE_S,
        min_run_s: float = MIN_RUN_S,
        records: FreezeRecords | None = None,
    ) -> None:
        self._freezer_of = freezer_of
        self.records = records or FreezeRecords(None)
        self.margin = margin
        self.burst_s = burst_s
        self.max_freeze_s = max_freeze_s
        self.min_run_s = min_run_s
        self.accounts: dict[Key, Account] = {}
        self.fed_at: float | None = None
        """When the last feed was: the busy seconds of a feed are those since then."""

    def watching(self) -> bool:
        """Whether any account is frozen, in debt or on its way there (it ran past its rate by more than half
        its burst since it was last full): the watch then reads utilization at every pass, not once a second,
        so a claim that starts to run flat out is caught within a watch of its debt."""
        low = self.burst_s / 2
        return any(a.balance < low or a.frozen_until is not None for a in self.accounts.values())

    def feed(self, now: float, usage: dict[Key, tuple[float, float, list[int]]]) -> None:
        """`usage`: per enforced claim and GPU, (ceiling as a fraction, busy seconds since the last feed,
        its processes' host PIDs there). Accounts not named are closed (their cgroups thawed)."""
        for key in [k for k in self.accounts if k not in usage]:
            self._thaw(key, now)
            del self.accounts[key]
        for key, (ceiling, busy, pids) in usage.items():
            # A new account is charged what its processes ran since the last feed, and earns since then: a
            # claim's first second on the GPU counts.
            account = self.accounts.setdefault(key, Account(balance=self.burst_s, fed_at=self.fed_at))
            rate = min(1.0, ceiling + self.margin)
            if account.fed_at is not None:
                account.balance = min(self.burst_s, account.balance + rate * (now - account.fed_at) - busy)
            account.fed_at = now
            if account.frozen_until is None:
                account.freezers = {f for f in map(self._freezer_of, pids) if f is not None}
            if account.balance < 0 and account.frozen_until is None and now >= account.run_until and rate > 0:
                self._freeze(key, now, min(-account.balance / rate, self.max_freeze_s))
        self.fed_at = now

    def tick(self, now: float) -> None:
        """Thaws what is due."""
        for key, account in self.accounts.items():
            if account.frozen_until is not None and now >= account.frozen_until:
                self._thaw(key, now)

    def close(self, now: float) -> None:
        """Thaws everything (the agent stops)."""
        for key in list(self.accounts):
            self._thaw(key, now)
        self.accounts.clear()

    def _freeze(self, key: Key, now: float, seconds: float) -> None:
        account = self.accounts[key]
        account.frozen_at, account.frozen_until = now, now + seconds
        account.freezes += 1
        for freezer in account.freezers:
            if not self.records.add(freezer):
                continue  # unrecorded, a freeze could outlive an agent killed before the thaw
            try:
                freezer.freeze()
            except FreezeError as exc:
                log.warning("cannot freeze a claim's container", extra={"claim": key[0], "error": str(exc)})

    def _thaw(self, key: Key, now: float) -> None:
        account = self.accounts[key]
        if account.frozen_until is None:
            return
        account.frozen_seconds += max(0.0, now - account.frozen_at)
        account.frozen_until = None
        account.run_until = now + self.min_run_s
        still = {
            f for k, a in self.accounts.items() if k != key and a.frozen_until is not None for f in a.freezers
        }
        for freezer in account.freezers - still:
            try:
                freezer.thaw()
            except FreezeError as exc:
                log.warning("cannot thaw a claim's container", extra={"claim": key[0], "error": str(exc)})
                if os.path.isdir(freezer.path):
                    continue  # still there and perhaps frozen: the record stays for the next agent
            self.records.remove(freezer)
