"""Leader election on a `coordination.k8s.io/v1` Lease, with client-go's rules.

Only the holder of the lease allocates, so two replicas never place claims from two different views of
the cluster. A replica takes the lease when it is free, already its own, or has not been renewed for
`leaseDurationSeconds`. Expiry is judged by when *this* replica last saw the lease record change (local
monotonic time), not by the holder's `renewTime`, so clock skew between nodes cannot cause two leaders.
Every write carries the resourceVersion it read: two candidates racing for a free lease get one success
and one 409.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dra_gpu.kube import AlreadyExists, ApiError, Conflict, KubeAPI, NotFound, builders, objects

Obj = dict[str, Any]
log = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = "dra-gpu-controller"


def micro_time(now: datetime) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate. Call `try_acquire_or_renew()` every `retry_period`; `is_leader()` answers cheaply."""

    def __init__(
        self,
        api: KubeAPI,
        identity: str,
        namespace: str,
        *,
        name: str = DEFAULT_LEASE_NAME,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not renew_deadline_s < lease_duration_s:
            raise ValueError("the renew deadline must be shorter than the lease duration")
        self.api, self.identity, self.namespace, self.name = api, identity, namespace, name
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self._monotonic = monotonic
        self._wall = wall_clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # when we last successfully wrote the lease as holder
        self.last_error: ApiError | None = None
        """What the API server answered in the last round when that was an error (None: it worked).
        The caller decides what to log and when to retry: this class logs no failure per round."""

    def is_leader(self) -> bool:
        """True while our last successful renewal is within the renew deadline."""
        return self._renewed_at is not None and self._monotonic() - self._renewed_at < self.renew_deadline_s

    def holder(self) -> str:
        return self._observed[0] if self._observed else ""

    def try_acquire_or_renew(self) -> bool:
        """One round; an ApiError is kept in `last_error`, a transport failure is raised."""
        now = self._monotonic()
        self.last_error = None
        try:
            lease = self.api.get("Lease", self.name, self.namespace)
        except NotFound:
            return self._create(now)
        except ApiError as exc:
            self.last_error = exc
            return self.is_leader()
        holder = objects.lease_holder(lease)
        record = (holder, objects.lease_renew_time(lease))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(objects.lease_duration_s(lease) or self.lease_duration_s)
        if holder and holder != self.identity and now < self._observed_at + duration:
            self._renewed_at = None
            return False
        if holder != self.identity:
            log.info("taking over the leader lease", extra={"previous": holder or "(none)"})
        renewed = builders.renewed(lease, self.identity, int(self.lease_duration_s), micro_time(self._wall()))
        try:
            stored = self.api.update("Lease", renewed)
        except Conflict:
            return False  # someone else wrote it first; the next round reads their record
        except ApiError as exc:
            self.last_error = exc
            return self.is_leader()
        return self._became(stored, now)

    def _create(self, now: float) -> bool:
        lease = builders.lease(
            self.name, self.namespace, self.identity, int(self.lease_duration_s), micro_time(self._wall())
        )
        try:
            stored = self.api.create("Lease", lease)
        except (AlreadyExists, Conflict):
            return False
        except ApiError as exc:
            self.last_error = exc
            return False
        log.info("acquired the new leader lease")
        return self._became(stored, now)

    def _became(self, stored: Obj, now: float) -> bool:
        self._observed = (objects.lease_holder(stored), objects.lease_renew_time(stored))
        self._observed_at = now
        self._renewed_at = now
        return True

    def release(self) -> None:
        """Give the lease up on a clean shutdown so the other replica need not wait for it to expire."""
        if self._renewed_at is None:
            return
        self._renewed_at = None
        try:
            lease = self.api.get("Lease", self.name, self.namespace)
            if objects.lease_holder(lease) != self.identity:
                return
            self.api.update("Lease", builders.renewed(lease, "", 1, micro_time(self._wall())))
        except ApiError as exc:
            log.warning("releasing the leader lease failed", extra={"error": str(exc)})
