"""Retrying against an API server that is down, quietly: exponential backoff with jitter, and one log
line per change of state instead of one per retry.

Five informers and the leader election each retry on their own; without backoff they hit a down API
server every second each, and with a log line (or a traceback) per attempt they bury everything else.
Jitter keeps the replicas (and the informers of one replica) from retrying in lock step once it is back.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Backoff:
    """Delays of `base_s`, doubling after each failure up to `cap_s`, each drawn from the upper half
    ([d/2, d]); `reset()` after a success starts again from `base_s`."""

    def __init__(self, base_s: float, cap_s: float, rng: Callable[[], float] = random.random) -> None:
        if not 0 < base_s <= cap_s:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base_s, self.cap_s = base_s, cap_s
        self._rng = rng
        self.failures = 0

    def next_delay(self) -> float:
        """The wait before the next attempt, counting one more failure."""
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.failures, 62))
        self.failures += 1
        return float(ceiling * (0.5 + 0.5 * self._rng()))

    def reset(self) -> None:
        self.failures = 0


def describe(exc: BaseException) -> str:
    """One line for a failed call: the error's own text, whitespace collapsed, and its type."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ApiReachability:
    """Whether the controller's calls to the API server work (it is down, unreachable, or refusing),
    from what each caller reports.

    Logs a warning when the first caller starts failing (naming it and its error) and an info line
    when the last one recovers; a caller's own changes go to debug. Readiness uses `reachable()`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: dict[str, str] = {}

    def reachable(self) -> bool:
        with self._lock:
            return not self._failing

    def failing(self) -> dict[str, str]:
        with self._lock:
            return dict(self._failing)

    def failed(self, caller: str, exc: BaseException, retry_in_s: float) -> None:
        error = describe(exc)
        with self._lock:
            was_reachable = not self._failing
            new = caller not in self._failing
            self._failing[caller] = error
        if was_reachable:
            log.warning(
                "calls to the API server fail; retrying with backoff, logging again when they succeed",
                extra={"caller": caller, "error": error},
            )
        elif new:
            log.debug("API call failing", extra={"caller": caller, "error": error})
        log.debug("retrying", extra={"caller": caller, "retry_in_s": round(retry_in_s, 3)})

    def succeeded(self, caller: str) -> None:
        with self._lock:
            if caller not in self._failing:
                return
            del self._failing[caller]
            recovered = not self._failing
        if recovered:
            log.info("calls to the API server succeed again", extra={"caller": caller})
        else:
            log.debug("API call working again", extra={"caller": caller})
