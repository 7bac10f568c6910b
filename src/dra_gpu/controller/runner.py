"""The running controller: informers, leader election, and a worker that runs reconcile passes.

A pass runs after any change that can matter (a claim, a pod that uses claims, a slice, a class, a
node), coalesced over `debounce_s`, and at least every `resync_s`; only the lease holder runs passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dra_gpu.controller.backoff import ApiReachability, Backoff, describe
from dra_gpu.controller.cache import Informer, start_all
from dra_gpu.controller.consumers import claim_names_of
from dra_gpu.controller.leader import DEFAULT_LEASE_NAME, LeaderElector
from dra_gpu.controller.metrics import ControllerMetrics
from dra_gpu.controller.reconciler import PassResult, Reconciler, Snapshot, read_taint_rules
from dra_gpu.kube import ApiError, KubeAPI
from dra_gpu.kube.errors import transport_errors
from dra_gpu.kube.events import EventRecorder

Obj = dict[str, Any]
log = logging.getLogger(__name__)

_UNREACHABLE: tuple[type[Exception], ...] = (OSError, *transport_errors())

WATCHED = ("ResourceSlice", "DeviceClass", "ResourceClaim", "Pod", "Node")


class Controller:
    def __init__(
        self,
        api: KubeAPI,
        *,
        identity: str,
        namespace: str = "default",
        leader_elect: bool = True,
        lease_name: str = DEFAULT_LEASE_NAME,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        resync_s: float = 30.0,
        debounce_s: float = 0.1,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.identity = identity
        self.metrics = ControllerMetrics()
        self.recorder = EventRecorder(api, identity, clock)
        self.elector = (
            LeaderElector(
                api,
                identity,
                namespace,
                name=lease_name,
                lease_duration_s=lease_duration_s,
                renew_deadline_s=renew_deadline_s,
                retry_period_s=retry_period_s,
                monotonic=monotonic,
                wall_clock=clock,
            )
            if leader_elect
            else None
        )
        self.reachability = ApiReachability()
        self._backoff_s, self._max_backoff_s = backoff_s, max(backoff_s, max_backoff_s)
        self.informers = {
            kind: Informer(
                api,
                kind,
                self._on_change(kind),
                retry_s=backoff_s,
                max_retry_s=self._max_backoff_s,
                reachability=self.reachability,
            )
            for kind in WATCHED
        }
        self.reconciler = Reconciler(
            api,
            recorder=self.recorder,
            metrics=self.metrics,
            clock=clock,
            monotonic=monotonic,
            is_leader=self.is_leader,
            on_write=self.informers["ResourceClaim"].assume,
        )
        self._resync_s = resync_s
        self._debounce_s = debounce_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.passes = 0
        self.last_result: PassResult | None = None

    # --- state ------------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def healthy(self) -> bool:
        return all(t.is_alive() for t in self._threads) if self._threads else False

    def ready(self) -> bool:
        """Every cache filled once and the API server answering (what /readyz reports)."""
        return self.reachability.reachable() and self.synced()

    def readiness(self) -> tuple[bool, str]:
        """`ready()` with the reason a probe shows when not."""
        failing = self.reachability.failing()
        if failing:
            caller, error = sorted(failing.items())[0]
            return False, f"calls to the API server fail ({caller}: {error})"
        if not self.synced():
            return False, "the caches are not filled yet"
        return True, "ok"

    def synced(self) -> bool:
        return all(i.has_synced() for i in self.informers.values())

    def snapshot(self) -> Snapshot:
        items = {kind: informer.items() for kind, informer in self.informers.items()}
        return Snapshot(
            items["ResourceSlice"],
            items["DeviceClass"],
            items["ResourceClaim"],
            items["Pod"],
            items["Node"],
            taint_rules=read_taint_rules(self.api),
        )

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self._threads = start_all(self.informers.values(), self._stop)
        for target, name in ((self._lead, "controller-leader"), (self._work, "controller-worker")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop allocating, hand the lease over, then wait for the watches.

        The lease goes as soon as the leader and worker threads have stopped (they notice `stop` at
        once), not after the informers: a real watch only notices `stop` with its next event, and the
        standby replica should not wait for that.
        """
        self._stop.set()
        self._wake.set()
        deciding = [t for t in self._threads if t.name in ("controller-leader", "controller-worker")]
        for thread in deciding:
            thread.join(timeout_s)
        if self.elector is not None:
            self.elector.release()
        self.metrics.leader.set(0)
        for thread in self._threads:
            if thread not in deciding:
                thread.join(timeout_s)

    def run_pass(self) -> PassResult:
        """One pass on the cached state, if this replica leads."""
        result = self.reconciler.reconcile(self.snapshot()) if self.is_leader() else PassResult()
        self.passes += 1
        self.last_result = result
        return result

    # --- threads ----------------------------------------------------------------------------------

    def _on_change(self, kind: str) -> Callable[[str, Obj], None]:
        def changed(event_type: str, obj: Obj) -> None:
            if kind == "Pod" and event_type != "SYNC" and not claim_names_of(obj):
                return  # pods without claims never change what we do
            self._wake.set()

        return changed

    def _lead(self) -> None:
        if self.elector is None:
            self.metrics.leader.set(1)
            self._stop.wait()
            return
        was_leader = False
        period = self.elector.retry_period_s
        backoff = Backoff(period, max(period, self._max_backoff_s))
        while not self._stop.is_set():
            error: BaseException | None
            try:
                leading = self.elector.try_acquire_or_renew()
                error = self.elector.last_error
            except Exception as exc:  # a transport failure: keep the thread, judge by the last renewal
                leading, error = self.elector.is_leader(), exc
            if error is None:
                backoff.reset()
                self.reachability.succeeded("leader election")
                wait = period
            else:
                # A leader keeps its pace (its renew deadline bounds the retries); the others back off.
                wait = period if leading else backoff.next_delay()
                self.reachability.failed("leader election", error, wait)
            self.metrics.leader.set(1 if leading else 0)
            if leading and not was_leader:
                log.info("leading: this replica allocates", extra={"identity": self.identity})
                self._wake.set()
            elif was_leader and not leading:
                log.warning("lost the leader lease; standing by", extra={"identity": self.identity})
            was_leader = leading
            self._stop.wait(wait)

    def _work(self) -> None:
        while not self._stop.is_set() and not self.synced():
            self._stop.wait(0.05)
        while not self._stop.is_set():
            self._wake.wait(self._resync_s)
            if self._stop.is_set():
                return
            self._wake.clear()
            self._stop.wait(self._debounce_s)  # let a burst of events land in one pass
            try:
                self.run_pass()
            except _UNREACHABLE as exc:
                # The API server went away mid-pass: said once, not with a traceback per pass.
                self.reachability.failed("reconcile", exc, self._resync_s)
                continue
            except ApiError as exc:  # the API server answered, with an error: it is reachable
                self.reachability.succeeded("reconcile")
                log.warning(
                    "reconcile pass failed; retrying on the next change or resync",
                    extra={"error": describe(exc)},
                )
            except Exception:
                log.exception("reconcile pass failed; retrying on the next change or resync")
            else:
                self.reachability.succeeded("reconcile")
