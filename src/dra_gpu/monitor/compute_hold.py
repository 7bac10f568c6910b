"""The node holds a claim's GPU time to its ceiling, from the driver's figures, with the kernel's freezer.

Each enforced claim has, per GPU, an account of GPU seconds (a token bucket): it earns its ceiling plus
MARGIN for every second of wall time, spends what NVML's per-process utilization says its processes ran,
and holds at most BURST_S ahead. A claim in debt has the cgroups of its GPU processes' containers frozen
until what it earns while frozen repays the debt - at most MAX_FREEZE_S at a time, then thawed for at least
MIN_RUN_S - and what it took beyond is given back. A claim once frozen is repaying: until it has stayed
out of debt for a whole WINDOW_S, it earns its ceiling plus the margin less the swing of its duty cycle over a
window - it runs unseen from one watch to the next, and a thaw, which comes at a watch, may leave it credit
beyond its debt: both are at most the longest gap between two watches - and no less than half its ceiling.
So a process that bypasses the library gets at most its ceiling plus the margin over any WINDOW_S, not that
plus the swing. An honest claim (the limiter holds it at its ceiling) never goes into debt, so it never
repays: the margin is above what the driver's sampling and the limiter's own pacing put on top of the
ceiling.

While a claim is frozen, nothing in its containers runs: probes and `kubectl exec` wait for the thaw (at
most MAX_FREEZE_S), SIGTERM is delivered when it thaws (cgroup v2 lets SIGKILL through at once). A claim
that goes away (unprepared, its processes gone) and an agent that stops thaw what they froze. Each cgroup is
recorded in the agent's state directory before it is frozen (`FreezeRecords`): an agent killed mid-freeze
leaves the record, and the next agent thaws it when it starts.
"""

from __future__ import annotations

import logging
import os
from collections import deque
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
MIN_RUN_S = 0.15
"""The shortest run between two freezes."""
HELD_LOOK_S = 0.15
"""While a claim is held (frozen, repaying or in debt), the longest gap between two looks at it, whatever the
memory watch's interval: at the default 1 s watch a claim would run a whole second unseen after each thaw, and
a freeze of at most MAX_FREEZE_S could not bring it below a third of the GPU."""
WINDOW_S = 10.0
"""The window the share is held over: a claim frozen once earns less than its rate (its ceiling plus the
margin) by the duty cycle's swing until it has stayed out of debt for this long."""

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
    repaying: bool = False
    """Frozen since it last stayed out of debt for a whole WINDOW_S: it earns less by the duty cycle's swing."""
    debt_at: float = 0.0
    """When its balance was last below zero."""
    repaying_since: float = 0.0
    runs: deque[tuple[float, float, float]] = field(default_factory=deque)
    """While it repays, per feed of the last window: (when, busy seconds, seconds it was not frozen)."""
    frozen_mark: float = 0.0
    """Its frozen seconds (`frozen_total`) at the last feed."""

    def frozen_total(self, now: float) -> float:
        """Seconds it has been frozen, the freeze under way included."""
        return self.frozen_seconds + (now - self.frozen_at if self.frozen_until is not None else 0.0)


class ComputeHold:
    """Accounts, freezes and thaws. `freezer_of(pid)`: the freezer of a host process's container cgroup."""

    def __init__(
        self,
        freezer_of: Callable[[int], CgroupFreezer | None],
        margin: float = MARGIN,
        burst_s: float = BURST_S,
        max_freeze_s: float = MAX_FREEZE_S,
        min_run_s: float = MIN_RUN_S,
        window_s: float = WINDOW_S,
        records: FreezeRecords | None = None,
    ) -> None:
        self._freezer_of = freezer_of
        self.records = records or FreezeRecords(None)
        self.margin = margin
        self.burst_s = burst_s
        self.max_freeze_s = max_freeze_s
        self.min_run_s = min_run_s
        self.window_s = window_s
        self.accounts: dict[Key, Account] = {}
        self.fed_at: float | None = None
        """When the last feed was: the busy seconds of a feed are those since then."""
        self._gaps: deque[tuple[float, float]] = deque()
        """(when, seconds since the feed before) of the feeds of the last window."""

    def swing(self, now: float) -> float:
        """The longest gap between two feeds over the last window: the most a claim runs unseen between two
        looks, and the most credit a thaw at a look leaves it."""
        while self._gaps and self._gaps[0][0] < now - self.window_s:
            self._gaps.popleft()
        return max((gap for _, gap in self._gaps), default=0.0)

    def watching(self) -> bool:
        """Whether any account is frozen, in debt or on its way there (it ran past its rate by more than half
        its burst since it was last full): the watch then reads utilization at every pass, not once a second,
        so a claim that starts to run flat out is caught within a watch of its debt."""
        low = self.burst_s / 2
        return any(a.balance < low or a.frozen_until is not None for a in self.accounts.values())

    def next_look(self, now: float) -> float | None:
        """When the monitor should look next (time.monotonic) for the claims it holds: a thaw that falls due, or
        HELD_LOOK_S after now while any claim is frozen, repaying or on its way into debt; None when none is."""
        if not self.watching() and not any(a.repaying for a in self.accounts.values()):
            return None
        due = [a.frozen_until for a in self.accounts.values() if a.frozen_until is not None]
        return min([now + HELD_LOOK_S, *due])

    def feed(self, now: float, usage: dict[Key, tuple[float, float, list[int]]]) -> None:
        """`usage`: per enforced claim and GPU, (ceiling as a fraction, busy seconds since the last feed,
        its processes' host PIDs there). Accounts not named are closed (their cgroups thawed)."""
        for key in [k for k in self.accounts if k not in usage]:
            self._thaw(key, now)
            del self.accounts[key]
        if self.fed_at is not None and now > self.fed_at:
            self._gaps.append((now, now - self.fed_at))
        swing = self.swing(now)
        for key, (ceiling, busy, pids) in usage.items():
            # A new account is charged what its processes ran since the last feed, and earns since then: a
            # claim's first second on the GPU counts.
            account = self.accounts.setdefault(key, Account(balance=self.burst_s, fed_at=self.fed_at))
            rate = min(1.0, ceiling + self.margin)
            if account.repaying:
                rate = max(ceiling / 2, rate - swing / self.window_s, self.margin / 2)
            if account.fed_at is not None:
                account.balance = min(self.burst_s, account.balance + rate * (now - account.fed_at) - busy)
                if account.repaying:
                    self._repaid(account, now, ceiling, busy)
            account.fed_at = now
            account.frozen_mark = account.frozen_total(now)
            if account.balance < 0:
                account.debt_at = now
            if account.frozen_until is None:
                account.freezers = {f for f in map(self._freezer_of, pids) if f is not None}
            if account.balance < 0 and account.frozen_until is None and now >= account.run_until and rate > 0:
                self._freeze(key, now, min(-account.balance / rate, self.max_freeze_s))
        self.fed_at = now

    def _repaid(self, account: Account, now: float, ceiling: float, busy: float) -> None:
        """Ends the repaying of a claim that stayed out of debt for a whole window, or that over a whole window
        ran no more than its ceiling plus the margin of the time it was not frozen: a claim the limiter paces
        (frozen once by a glitch of the figures) is not held below its ceiling for long, a process that runs
        flat out whenever it is thawed is."""
        assert account.fed_at is not None
        thawed = max(0.0, now - account.fed_at - (account.frozen_total(now) - account.frozen_mark))
        account.runs.append((now, busy, thawed))
        while account.runs[0][0] <= now - self.window_s:
            account.runs.popleft()
        if now - account.repaying_since < self.window_s:
            return
        ran = sum(r[1] for r in account.runs)
        up = sum(r[2] for r in account.runs)
        if (account.balance >= 0 and now - account.debt_at >= self.window_s) or (
            up > 0 and ran <= min(1.0, ceiling + self.margin) * up
        ):
            account.repaying = False
            account.runs.clear()

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
        if not account.repaying:
            account.repaying, account.repaying_since = True, now
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
