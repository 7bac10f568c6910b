"""The kubelet's calls as the preparer serves them: claim by claim, each claim's failure its own answer,
no claim started once the call's deadline would pass before the answer reaches the kubelet, or once the
kubelet cancelled the call; and how long calls have gone without finishing a claim (liveness).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dra_gpu.plugin.checkpoint import (
    PreparedDevice,
)
from dra_gpu.plugin.errors import PrepareError, bounded, describe
from dra_gpu.plugin.locking import LockTimeout
from dra_gpu.plugin.metrics import PluginMetrics
from dra_gpu.plugin.sharing.plan import ClaimInfo

log = logging.getLogger(__name__)

DEADLINE_PASSED = (
    "not started: the deadline of the kubelet's call would pass before this claim could be done; the "
    "kubelet's next call does it"
)
CANCELLED = "not started: the kubelet cancelled the call; its next call does it"
ANSWER_MARGIN_S = (0.5, 2.0)
"""Time kept before a call's deadline to answer it (at least, at most; 5 % of the call's time between)."""


def answer_by(deadline: float | None, now: float) -> float | None:
    """When the work of a call with `deadline` must be over, so that the answer reaches the kubelet in time."""
    if deadline is None:
        return None
    least, most = ANSWER_MARGIN_S
    return deadline - min(most, max(least, 0.05 * (deadline - now)))


STALLED_FACTOR = 4
"""Calls that finish no claim for this many lock timeouts are stuck (liveness fails)."""


@dataclass
class PrepareResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


Work = Callable[[ClaimInfo, float | None], list[PreparedDevice]]
"""One claim's prepare or unprepare, to be done by `deadline` (time.monotonic, None: none)."""


class Calls:
    """Serving a call of the kubelet claim by claim (see the module docstring); it knows nothing of what
    a claim's work is, only whether calls are in progress and make progress."""

    def __init__(self, *, metrics: PluginMetrics, lock_timeout_s: float, driver: str) -> None:
        self.metrics = metrics
        self.lock_timeout_s = lock_timeout_s
        """The longest any step waits on a lock (liveness allows calls a few of them per claim)."""
        self.driver = driver
        self._calls_lock = threading.Lock()
        self._calls = 0
        """The kubelet's calls in progress."""
        self._progressed_at = time.monotonic()
        """When a call last finished a claim (or started, when none was running)."""

    def each(
        self,
        operation: str,
        claims: Sequence[ClaimInfo],
        work: Work,
        deadline: float | None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, PrepareResult]:
        """Do `work` claim by claim. A claim is not started once the caller cancelled the call, nor when
        the longest claim of the call so far would not end before `answer_by(deadline)`: the kubelet
        gets its answer, with those claims "not started", before its deadline."""
        results: dict[str, PrepareResult] = {}
        cut = answer_by(deadline, time.monotonic())
        longest = 0.0
        with self._calls_lock:
            if self._calls == 0:
                self._progressed_at = time.monotonic()
            self._calls += 1
        try:
            for claim in claims:
                if claim.uid in results:
                    continue  # the same claim twice in one call: one answer
                now = time.monotonic()
                if cut is not None and now + longest >= cut:
                    self.metrics.errors.labels(operation=operation, reason="deadline").inc()
                    results[claim.uid] = PrepareResult(error=DEADLINE_PASSED)
                    continue
                if cancelled is not None and cancelled():  # (past its deadline, a call is inactive too)
                    self.metrics.errors.labels(operation=operation, reason="cancelled").inc()
                    results[claim.uid] = PrepareResult(error=CANCELLED)
                    continue
                results[claim.uid] = self._guarded(operation, claim, lambda c: work(c, cut))
                self._progressed_at = time.monotonic()
                longest = max(longest, self._progressed_at - now)
        finally:
            with self._calls_lock:
                self._calls -= 1
        for error, why in ((DEADLINE_PASSED, "the call's deadline"), (CANCELLED, "the call was cancelled")):
            skipped = sum(r.error == error for r in results.values())
            if skipped:
                log.warning(
                    f"{why}: {skipped} of its claims were not started",
                    extra={"operation": operation, "claims": len(results)},
                )
        return results

    def busy(self) -> bool:
        """Whether the kubelet's calls are in progress."""
        return self._calls > 0

    def stalled(self) -> str | None:
        """Why liveness should fail: calls are in progress and none finished a claim for longer than
        any step may take (each waits on a lock at most `lock_timeout_s`, and a GPU command has its own
        timeout); None otherwise."""
        late = time.monotonic() - self._progressed_at
        if self._calls == 0 or late <= STALLED_FACTOR * self.lock_timeout_s:
            return None
        return (
            f"{self._calls} of the kubelet's calls are in progress and none has finished a claim for "
            f"{late:.0f} s"
        )

    def _guarded(
        self,
        operation: str,
        claim: ClaimInfo,
        work: Callable[[ClaimInfo], list[PreparedDevice]],
    ) -> PrepareResult:
        fields = {"claim": claim.ref, "uid": claim.uid}
        try:
            devices = work(claim)
        except PrepareError as exc:
            return self._failed(operation, claim, exc.reason, exc.message)
        except LockTimeout as exc:
            return self._failed(operation, claim, "lock_timeout", str(exc))
        except OSError as exc:
            return self._failed(
                operation, claim, "filesystem", f"{operation} of {claim.ref}: {describe(exc)}"
            )
        except Exception as exc:
            log.exception(f"{operation} failed unexpectedly", extra=fields)
            text = f"internal error in the {self.driver} plugin: {describe(exc)}"
            return self._failed(operation, claim, "internal", text, logged=True)
        log.info(f"{operation} done", extra={**fields, "devices": [d.device for d in devices]})
        return PrepareResult(devices=devices)

    def _failed(
        self, operation: str, claim: ClaimInfo, reason: str, message: str, logged: bool = False
    ) -> PrepareResult:
        """One claim's failure: counted, logged and answered, its message bounded (it quotes requests)."""
        self.metrics.errors.labels(operation=operation, reason=reason).inc()
        message = bounded(message)
        if not logged:
            log.warning(
                f"{operation} failed",
                extra={"claim": claim.ref, "uid": claim.uid, "reason": reason, "error": message},
            )
        return PrepareResult(error=message)
