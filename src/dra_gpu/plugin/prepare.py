"""Prepare and unprepare claims: the checkpointed, crash-safe core of the kubelet plugin.

Every call runs under the locks of its claim and of the claim's GPUs, and takes the node lock only
for each read-modify-write of the checkpoint and each CDI spec write (see ``locking``): a GPU command
that hangs holds up only that GPU's claims. Every call follows the checkpoint's phases, so a plugin
killed at any point leaves a state from which the kubelet's repeated call converges:

- prepare writes ``PrepareStarted`` (with the holds it is about to take and the spec it will write)
  before touching the node, then applies the holds, writes the CDI spec, writes ``PrepareCompleted``;
  a repeated prepare of a ``PrepareStarted`` claim first undoes the record, then starts over;
- a repeated prepare of a completed claim returns the recorded answer, unless the node rebooted or the
  spec file is gone: then the holds are re-applied and the spec is rewritten from the record; or
  unless the API shows the claim (same UID) allocated anew since: then the record is undone and the new
  allocation prepared;
- unprepare removes the spec, releases the holds (a GPU-wide setting only with its last holder in the
  checkpoint) and drops the record; it never needs the API. Interrupted, it leaves a completed record
  without a spec, which the kubelet's next call, prepare or unprepare, brings to the state it asks for.

Reference counts of GPU-wide settings are never stored: they are the holds of the claims in the
checkpoint, so they survive restarts by construction.

A call's work is proportional to its claims, not to the node: records are read and written one at a
time (the checkpoint store keeps them and an index of who is on which GPU), never copied as a whole.
A call stops starting claims when its deadline has passed; a claim it started is finished or rolled
back, so every claim is either prepared or not. One claim's failure is that claim's error only.
A rollback or sweep that cannot undo something keeps the claim's record, so that a later call, or
the next sweep, tries again; the sweep goes on to the other records.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dra_gpu.inventory import GpuInfo, Inventory
from dra_gpu.kube import KubeAPI, objects
from dra_gpu.kube.events import EventRecorder
from dra_gpu.plugin import sharing
from dra_gpu.plugin.cdi_specs import ClaimSpecs
from dra_gpu.plugin.checkpoint import (
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    ClaimState,
    Hold,
    PreparedClaim,
    PreparedDevice,
)
from dra_gpu.plugin.claims import allocation_digest, allocation_results, fetch_claim, over_capacity, shares_of
from dra_gpu.plugin.errors import PrepareError, bounded, describe, filesystem_error
from dra_gpu.plugin.gpu_control import CommandError
from dra_gpu.plugin.identity import claim_problem, is_path_component
from dra_gpu.plugin.locking import GPU_LOCK_DIR_NAME, KeyLocks, LockTimeout, NodeLock
from dra_gpu.plugin.metrics import PluginMetrics
from dra_gpu.plugin.mig_devices import mig_views
from dra_gpu.plugin.mig_instances import MigInstances
from dra_gpu.plugin.sharing.directories import claim_temp_files, remove_tree
from dra_gpu.plugin.sharing.plan import ClaimInfo, Holder, HoldHandler, NodeContext, Plan, Share
from dra_gpu.vocabulary.device import device_name as slice_device_name

log = logging.getLogger(__name__)

STEPS = (
    "prepare:checkpoint-started",
    "prepare:setup-applied",
    "prepare:cdi-written",
    "prepare:checkpoint-completed",
    "unprepare:cdi-removed",
    "unprepare:holds-released",
    "unprepare:checkpoint-removed",
)
"""The points between the steps of prepare and unprepare; a fault hook is called at each."""

FaultHook = Callable[[str], None]
EVENT_COMPONENT = "dra-gpu-kubelet-plugin"
NOTICE_REASON = "PreparedWithCaveat"
"""The event reason of what a prepared claim's user must know (a limit that holds per process only)."""

PREPARE_FAILED_REASON = "PrepareFailed"
NOT_REPORTED = frozenset({"claim_not_found", "api_error", "uid_mismatch", "identity_mismatch"})
"""Failures with no claim to report on, or none the user can fix in it."""


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


TEMP_FILE_AGE_S = 600.0
"""A temporary file this old in a claim's directory or the CDI directory is left by an interrupted write."""
COMPACT_IN_CALL_FACTOR = 8
"""A call folds the checkpoint's journal into its snapshot itself only when the background did not."""
STALLED_FACTOR = 4
"""Calls that finish no claim for this many lock timeouts are stuck (liveness fails)."""


def device_name(gpu: GpuInfo) -> str:
    """The GPU's device name in the node's pool, as the slice publisher writes it."""
    return slice_device_name(gpu.index)


@dataclass
class PrepareResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class Preparer:
    def __init__(
        self,
        *,
        api: KubeAPI,
        inventory: Inventory,
        node: NodeContext,
        store: CheckpointStore,
        lock: NodeLock,
        specs: ClaimSpecs,
        gpu_locks: KeyLocks | None = None,
        pool: str,
        boot_id: str,
        metrics: PluginMetrics | None = None,
        fault_hook: FaultHook | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.api = api
        self.inventory = inventory
        self.node = node
        self.store = store
        self.lock = lock
        self.gpu_locks = gpu_locks or KeyLocks(lock.path.parent / GPU_LOCK_DIR_NAME, lock.timeout_s)
        self.specs = specs
        self.pool = pool
        self.boot_id = boot_id
        self.metrics = metrics or PluginMetrics()
        self.events = events or EventRecorder(api, pool, lambda: datetime.now(UTC), component=EVENT_COMPONENT)
        self._hook = fault_hook or (lambda _step: None)
        self._mig = MigInstances(node.state_dir, node.commands, lock, lambda step: self._hook(step), api)
        self._backends = sharing.backends()
        self._handlers = sharing.hold_handlers()
        self._notices: dict[str, tuple[dict[str, Any], list[str]]] = {}
        """Claim UID -> (claim, notices) of fresh prepares, posted as events once no lock is held."""
        self._notices_lock = threading.Lock()
        self._rebuild_wanted = False
        """A damaged checkpoint was set aside: the next call rebuilds the state before its own work."""
        self._rebuild_lock = threading.Lock()
        self._metrics_reloads = -1
        """The store's `reloads` the metrics were last computed for (they follow each write since)."""
        self._loaded: tuple[int, Checkpoint] | None = None
        """(the node lock's hold, the checkpoint loaded under it)."""
        self._gone_once: set[str] = set()
        """UIDs of completed records whose claims the last stale-claim sweep found gone."""
        self._calls_lock = threading.Lock()
        self._calls = 0
        """The kubelet's calls in progress."""
        self._progressed_at = time.monotonic()
        """When a call last finished a claim (or started, when none was running)."""

    # -- entry points ------------------------------------------------------------------------------
    def start(self) -> None:
        """Load (or rebuild) the checkpoint once, before the kubelet can call."""
        with self.lock.hold():
            checkpoint = self._load()
            rebuild = checkpoint.rebuildPending or (
                not self.store.exists() and bool(self.specs.uids_on_disk())
            )
            for path in [*self.store.temp_files(), *self._mig.temp_files()]:
                # Written only under the node lock, which this holds: each is from an interrupted write.
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            if not rebuild:
                for uid in self._uids_on_disk() - set(checkpoint.claims):
                    # Specs and directories are created after their claim's record: these are from a lost write.
                    self._remove_leftovers(uid)
                try:
                    self.store.compact()
                except (PrepareError, OSError) as exc:  # a full disk: unprepares must still run, and free it
                    log.warning(
                        "could not fold the checkpoint's journal into its snapshot at start; serving with "
                        "the journal, folded later",
                        extra={"error": bounded(describe(exc))},
                    )
        if rebuild:
            log.warning("rebuilding the state from the claims in the API and the files on disk")
            self._rebuild()
        checkpoint = self.snapshot()
        if not checkpoint.rebuildPending:  # else the claims in use are not known yet: keep their instances
            self._mig.reconcile(set(checkpoint.claims), self.inventory.gpus())
        stale = [c.ref for c in checkpoint.claims.values() if c.bootId != self.boot_id]
        if stale:
            log.info(
                "the node rebooted since these claims were prepared; their CDI specs and GPU settings "
                "are restored when the kubelet prepares them again",
                extra={"claims": stale},
            )
        self._refresh_metrics(force=True)

    def close(self) -> None:
        """Fold the checkpoint's journal into its snapshot (at stop: the next start reads one file)."""
        try:
            with self.lock.hold():
                self._load()
                self.store.compact()
        except Exception as exc:  # the next start reads the journal too
            log.warning("could not write the checkpoint's snapshot at stop", extra={"error": describe(exc)})

    def _rebuild_if_lost(self) -> None:
        """Rebuild now if a damaged checkpoint was set aside (see `_load`); one caller at a time.

        Called before and after every prepare and unprepare, and by the supervision loop.
        """
        if not self._rebuild_wanted or not self._rebuild_lock.acquire(blocking=False):
            return
        try:
            if self._rebuild_wanted:
                self._rebuild()
        except Exception:
            log.exception("rebuilding the state failed; the stale-claim sweep tries again")
        finally:
            self._rebuild_lock.release()

    def prepare(
        self,
        claims: Sequence[ClaimInfo],
        deadline: float | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, PrepareResult]:
        """Prepare each claim; `deadline` (time.monotonic) is the caller's: no claim starts that would
        end after it, nor once `cancelled()` (see `_each`)."""
        started = time.perf_counter()
        self._rebuild_if_lost()
        results = self._each("prepare", claims, self._prepare, deadline, cancelled)
        self._rebuild_if_lost()
        self._refresh_metrics()
        self._post_notices([claim.uid for claim in claims])
        self.metrics.prepare_seconds.observe(time.perf_counter() - started)
        return results

    def _post_notices(self, uids: Sequence[str]) -> None:
        """What users of freshly prepared claims must know, as Warning events on the claims."""
        with self._notices_lock:
            pending = [self._notices.pop(uid) for uid in uids if uid in self._notices]
        for obj, texts in pending:
            for text in texts:
                try:
                    self.events.record(obj, "Warning", NOTICE_REASON, text)
                except Exception as exc:  # the API unreachable: the prepare's log line stays
                    log.warning("could not post a claim's notice as an event", extra={"error": str(exc)})

    def unprepare(
        self,
        claims: Sequence[ClaimInfo],
        deadline: float | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, str]:
        started = time.perf_counter()
        self._rebuild_if_lost()
        results = self._each("unprepare", claims, self._unprepare, deadline, cancelled)
        self._rebuild_if_lost()
        self._refresh_metrics()
        self.metrics.unprepare_seconds.observe(time.perf_counter() - started)
        return {uid: result.error for uid, result in results.items()}

    def _each(
        self,
        operation: str,
        claims: Sequence[ClaimInfo],
        work: Callable[[ClaimInfo, float | None], list[PreparedDevice]],
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
        any step may take (each waits on a lock at most `lock.timeout_s`, and a GPU command has its own
        timeout); None otherwise."""
        late = time.monotonic() - self._progressed_at
        if self._calls == 0 or late <= STALLED_FACTOR * self.lock.timeout_s:
            return None
        return (
            f"{self._calls} of the kubelet's calls are in progress and none has finished a claim for "
            f"{late:.0f} s"
        )

    def _refresh_metrics(self, force: bool = False) -> None:
        """Recount the gauges if the checkpoint was read anew since (each write updates them itself).

        Another process's writes are found by the next load (every call loads): a call that ends with
        `reloads` unchanged changed nothing the metrics did not follow."""
        if not force and self.store.reloads == self._metrics_reloads:
            return  # the common case: this process's own writes, which the metrics followed
        try:
            with self.lock.hold():
                checkpoint = self._load()
                if force or self.store.reloads != self._metrics_reloads:
                    self.metrics.refresh(checkpoint)
                    self._metrics_reloads = self.store.reloads
        except Exception as exc:  # the next call refreshes them; never this call's failure
            log.debug("metrics not refreshed", extra={"error": str(exc)})

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
            text = f"internal error in the {self.node.driver} plugin: {describe(exc)}"
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

    # -- checkpoint ----------------------------------------------------------------------------------
    def _load(self) -> Checkpoint:
        """The checkpoint as stored; only under the node lock (the object is the store's own).

        A damaged file is set aside and an empty checkpoint marked `rebuildPending` takes its place.
        The files are looked at once per hold of the node lock: nobody else writes while it is held.
        """
        if self._loaded is not None and self._loaded[0] == self.lock.holds and self.store.current is not None:
            return self.store.current
        try:
            checkpoint = self.store.load()
            self._loaded = (self.lock.holds, checkpoint)
            return checkpoint
        except CheckpointCorrupt as exc:
            moved = self.store.set_aside()
            log.error(
                "checkpoint cannot be trusted; set aside, rebuilding the state from disk and the API",
                extra={"reason": str(exc), "moved_to": str(moved)},
            )
            # The rebuild reads the API and sets GPUs up: it runs once the node lock is released.
            checkpoint = Checkpoint(rebuildPending=True)
            self.store.save(checkpoint)
            self._rebuild_wanted = True
            self.metrics.refresh(checkpoint)
            return checkpoint

    def _put(self, record: PreparedClaim) -> None:
        """Store one claim's record (a new object: stored records are never changed in place)."""
        with self.lock.hold():
            before = self._load().claims.get(record.uid)
            self.store.put(record)
            self.metrics.claim_changed(before, record)
            self._compact_if_overdue()

    def _drop(self, uid: str) -> None:
        with self.lock.hold():
            before = self._load().claims.get(uid)
            if before is None:
                return
            self.store.drop(uid)
            self.metrics.claim_changed(before, None)
            self._compact_if_overdue()

    def _set_pending(self, value: bool) -> None:
        with self.lock.hold():
            if self._load().rebuildPending != value:
                self.store.set_rebuild_pending(value)

    def _compact_if_overdue(self) -> None:
        """The background folds the journal in; a call does it only if the journal got far too long."""
        if self.store.compact_due(COMPACT_IN_CALL_FACTOR):
            self.store.compact()

    def compact(self) -> None:
        """Fold the checkpoint's journal into its snapshot once it has outgrown it (background duty)."""
        with self.lock.hold():
            self._load()
            if self.store.compact_due():
                self.store.compact()

    def _entry(self, uid: str) -> PreparedClaim | None:
        with self.lock.hold():
            return self._load().claims.get(uid)

    # -- locks -----------------------------------------------------------------------------------------
    def _gpu_uuids(self, entry: PreparedClaim | None, obj: Mapping[str, Any] | None) -> set[str]:
        """The GPUs a call on this claim may touch: those of its record and of its allocation here."""
        uuids = {s.gpu for s in entry.shares} if entry is not None else set()
        uuids |= {
            str(h.params["gpu"]) for h in (entry.holds if entry is not None else []) if "gpu" in h.params
        }
        if obj is not None:
            gpus = self._gpus()
            for result in allocation_results(obj, self.node.driver, self.pool):
                gpu = gpus.get(str(result.get("device")))
                if gpu is not None:
                    uuids.add(gpu.uuid)
        return uuids

    @contextmanager
    def _claim_locked(
        self, claim: ClaimInfo, obj: Mapping[str, Any] | None, deadline: float | None = None
    ) -> Iterator[PreparedClaim | None]:
        """Hold the claim's and its GPUs' locks; yields the claim's record as it is under them.

        A record of the UID under another namespace or name is never yielded (PrepareError): a call
        naming a prepared claim's UID with another claim's name gets neither its devices nor its undoing.

        The GPUs come from the record read before locking; should the record have moved to other
        GPUs meanwhile (a concurrent call for the same claim in another plugin process), lock again.
        Waiting ends at `deadline` too (LockTimeout): the claim is then left as it was.
        """
        entry = self._entry(claim.uid)
        for _ in range(3):
            wanted = self._gpu_uuids(entry, obj)
            with self.gpu_locks.hold({f"claim:{claim.uid}", *wanted}, deadline=deadline):
                current = self._entry(claim.uid)
                if current is not None and (current.namespace, current.name) != (claim.namespace, claim.name):
                    raise PrepareError(
                        f"the claim UID {claim.uid} was prepared on this node as ResourceClaim {current.ref}, "
                        f"not {claim.ref}: nothing was changed (a UID names one claim)",
                        reason="identity_mismatch",
                    )
                if self._gpu_uuids(current, obj) <= wanted:
                    yield current
                    return
                entry = current
        raise LockTimeout(f"claim {claim.ref}: its record kept changing GPUs while waiting for their locks")

    # -- prepare ---------------------------------------------------------------------------------------
    def _prepare(self, claim: ClaimInfo, deadline: float | None = None) -> list[PreparedDevice]:
        # The API read comes first, outside every lock: it can take as long as the API server's timeout.
        fetched: dict[str, Any] | None = None
        fetch_error: PrepareError | None = None
        try:
            fetched = fetch_claim(self.api, claim)
        except PrepareError as exc:
            fetch_error = exc
        try:
            return self._prepare_locked(claim, fetched, fetch_error, deadline)
        except PrepareError as exc:
            if exc.reason not in NOT_REPORTED:
                self._report(claim, fetched, exc)
            raise

    def _report(self, claim: ClaimInfo, obj: Mapping[str, Any] | None, exc: PrepareError) -> None:
        """A Warning event on the claim and on each pod it is reserved for, saying what to change.

        The kubelet retries a failed prepare for as long as the pod exists, and shows only the pod;
        the claim's event tells whoever looks at the claim, and repeats are folded into one event.
        """
        meta = {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid}
        targets: list[dict[str, Any]] = [
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta}
        ]
        for consumer in objects.reserved_for(obj or {}):
            if consumer.get("resource") == "pods" and not consumer.get("apiGroup"):
                pod = {"name": consumer.get("name"), "namespace": claim.namespace, "uid": consumer.get("uid")}
                targets.append({"apiVersion": "v1", "kind": "Pod", "metadata": pod})
        for target in targets:
            try:
                self.events.record(target, "Warning", PREPARE_FAILED_REASON, bounded(exc.message))
            except Exception as error:  # an event is never worth failing or retrying the call for
                log.warning("could not record a prepare failure event", extra={"error": str(error)})

    def _prepare_locked(
        self,
        claim: ClaimInfo,
        fetched: dict[str, Any] | None,
        fetch_error: PrepareError | None,
        deadline: float | None = None,
    ) -> list[PreparedDevice]:
        with self._claim_locked(claim, fetched, deadline) as entry:
            obj: dict[str, Any] | None = None
            if entry is not None and entry.state == ClaimState.PREPARE_COMPLETED:
                obj = self._reallocated(entry, fetched)
                if obj is None:
                    if entry.bootId == self.boot_id and self.specs.exists(claim.uid):
                        return entry.devices
                    lost = self._mig.lost(entry.uid, self.inventory.gpus())
                    if not lost:
                        return self._restore(entry)
                    obj = self._remake(entry, lost, fetched, fetch_error)
                else:
                    log.info(
                        "the claim was allocated again since it was prepared here; preparing the new allocation",
                        extra={"claim": entry.ref, "devices": [d.device for d in entry.devices]},
                    )
            elif entry is not None:
                log.info(
                    "finishing an interrupted operation before preparing",
                    extra={"claim": entry.ref, "state": entry.state},
                )
            if entry is not None:
                self._undo(entry)
            if obj is None:
                if fetched is None:
                    assert fetch_error is not None
                    raise fetch_error
                obj = fetched
            return self._prepare_fresh(claim, obj)

    def _remake(
        self,
        entry: PreparedClaim,
        lost: list[str],
        fetched: dict[str, Any] | None,
        fetch_error: PrepareError | None,
    ) -> dict[str, Any]:
        """The claim to prepare anew, when dynamic MIG instances it was prepared with are gone (a reboot):
        a new instance has a new UUID, so the recorded spec cannot be restored as it is."""
        if fetched is None:
            with self.lock.hold():
                self.specs.remove(entry.uid)  # it names the instance that is gone
            why = fetch_error.message if fetch_error is not None else "no answer"
            raise PrepareError(
                f"ResourceClaim {entry.ref}: its {', '.join(lost)} was lost (a reboot or a GPU reset); it "
                f"is made again from the claim's allocation, which could not be read: {why}",
                reason="mig_lost",
            )
        log.info(
            "the claim's dynamic MIG instances are gone (a reboot?); preparing it anew",
            extra={"claim": entry.ref, "lost": lost},
        )
        return fetched

    def _reallocated(self, entry: PreparedClaim, fetched: dict[str, Any] | None) -> dict[str, Any] | None:
        """The claim, if the API shows it with another allocation than `entry` was prepared from.

        Without an answer from the API (or a recorded digest) the record stands: a repeated prepare
        must work after a reboot without the API.
        """
        if entry.allocation is None or fetched is None:
            return None
        digest = allocation_digest(fetched, self.node.driver)
        return fetched if digest is not None and digest != entry.allocation else None

    def _handler(self, hold: Hold) -> HoldHandler:
        handler = self._handlers.get(hold.kind)
        if handler is None:
            raise PrepareError(
                f"the checkpoint records node-side setup of kind {hold.kind!r} ({hold.key}), which this "
                f"version of the plugin cannot apply or undo; run the plugin version that prepared the claim",
                reason="unknown_setup",
            )
        return handler

    def _gpus(self) -> dict[str, GpuInfo]:
        gpus = self.inventory.gpus()
        return {**{device_name(g): g for g in gpus}, **mig_views(gpus)[0]}

    def _prepare_fresh(self, claim: ClaimInfo, obj: dict[str, Any]) -> list[PreparedDevice]:
        """Prepare an allocation; the caller holds the claim's and its GPUs' locks."""
        shares = shares_of(obj, claim, self.node.driver, self.pool, self._gpus())
        for share in shares:
            if not share.gpu.healthy:
                raise PrepareError(
                    f"GPU {share.device} ({share.gpu.uuid}) is unhealthy: {share.gpu.health_reason}",
                    reason="unhealthy_device",
                )
        shares = self._mig.materialize(claim, shares, self.inventory.gpus())
        try:
            plan = self._plan(claim, shares)
        except Exception:
            self._mig.release(claim.uid, self.inventory.gpus())
            raise
        spec = plan.cdi_spec()
        entry = PreparedClaim(
            uid=claim.uid,
            namespace=claim.namespace,
            name=claim.name,
            state=ClaimState.PREPARE_STARTED,
            bootId=self.boot_id,
            devices=plan.answer(),
            shares=plan.share_records(),
            holds=plan.holds,
            cdiSpec=spec.to_dict(),
            allocation=allocation_digest(obj, self.node.driver),
        )
        self._put(entry)
        self._hook("prepare:checkpoint-started")
        applied: list[Hold] = []
        try:
            for hold in entry.holds:
                self._handler(hold).apply(hold, self.node)
                applied.append(hold)
            self._hook("prepare:setup-applied")
            with self.lock.hold():
                self.specs.write(claim.uid, spec)
            self._hook("prepare:cdi-written")
        except Exception:
            self._rollback(entry, applied)
            raise
        self._put(entry.model_copy(update={"state": ClaimState.PREPARE_COMPLETED}))
        self._hook("prepare:checkpoint-completed")
        for text in plan.notices:
            log.warning("prepared with a caveat", extra={"claim": claim.ref, "notice": text})
        if plan.notices:
            with self._notices_lock:
                self._notices[claim.uid] = (obj, list(plan.notices))
        return entry.devices

    def _others_on(self, claim: ClaimInfo, gpu_uuid: str) -> list[Holder]:
        """The shares other claims prepared on the GPU (not admin access), from the store's index."""
        with self.lock.hold():
            self._load()
            on_gpu = self.store.on_gpu(gpu_uuid)
        return [
            Holder(other.ref, record)
            for other in on_gpu
            if other.uid != claim.uid
            for record in other.shares
            if record.gpu == gpu_uuid and not record.adminAccess
        ]

    def _plan(self, claim: ClaimInfo, shares: list[Share]) -> Plan:
        plan = Plan(claim=claim, shares=shares, driver=self.node.driver)
        for backend in self._backends:
            backend.contribute(plan, self.node)
        records = plan.share_records()
        on_gpu: dict[str, list[Holder]] = {}
        for share in shares:
            if share.admin_access:
                continue
            if share.gpu.uuid not in on_gpu:
                on_gpu[share.gpu.uuid] = self._others_on(claim, share.gpu.uuid)
            others = list(on_gpu[share.gpu.uuid])
            others += [
                Holder(f"{claim.ref} (request {shares[r.position].request})", records[r.position])
                for r in shares[: share.position]
                if r.gpu.uuid == share.gpu.uuid and not r.admin_access
            ]
            for backend in self._backends:
                problem = backend.conflict(share, others)
                if problem is not None:
                    raise PrepareError(f"ResourceClaim {claim.ref}: {problem}", reason="conflict")
            problem = over_capacity(share, records[share.position], others, self.node.driver)
            if problem is not None:
                raise PrepareError(f"ResourceClaim {claim.ref}: {problem}", reason="over_capacity")
        return plan

    def _restore(self, entry: PreparedClaim) -> list[PreparedDevice]:
        """A completed claim whose spec or GPU settings are gone (reboot, wiped tmpfs): set up again."""
        log.info("restoring a prepared claim after a reboot or a lost CDI spec", extra={"claim": entry.ref})
        for hold in entry.holds:
            self._handler(hold).apply(hold, self.node)
        if entry.cdiSpec is None:
            raise PrepareError(f"the checkpoint has no CDI spec for claim {entry.ref}", reason="internal")
        with self.lock.hold():
            self.specs.write(entry.uid, entry.cdiSpec)
            current = self._load().claims.get(entry.uid)
            if current is not None:
                self._put(current.model_copy(update={"bootId": self.boot_id}))
        return entry.devices

    def _rollback(self, entry: PreparedClaim, applied: list[Hold]) -> None:
        """Undo what a failed prepare did. What cannot be undone keeps the claim's record, so that the
        kubelet's next call (prepare undoes it first, unprepare undoes it) or the sweep retries it."""
        try:
            last = self._last_holders(entry)
            for hold in reversed(applied):
                self._handler(hold).release(hold, self.node, last[hold.key])
            self._mig.release(entry.uid, self.inventory.gpus())
            with self.lock.hold():
                self.specs.remove(entry.uid)
                self._drop(entry.uid)
        except Exception as exc:
            self.metrics.errors.labels(operation="rollback", reason=_reason(exc)).inc()
            log.error(
                "rolling back a failed prepare left setup behind; its record stays for a later call to retry",
                extra={"claim": entry.ref, "error": bounded(describe(exc))},
            )

    # -- unprepare -------------------------------------------------------------------------------------
    def _unprepare(self, claim: ClaimInfo, deadline: float | None = None) -> list[PreparedDevice]:
        with self._claim_locked(claim, None, deadline) as entry:
            if entry is None:
                with self.lock.hold():
                    if claim.uid not in self._load().claims:
                        self._remove_leftovers(claim.uid)
                return []
            self._undo(entry)
            return []

    def _last_holders(self, entry: PreparedClaim) -> dict[str, bool]:
        """For each hold of `entry`, whether no other claim holds its setting (the claim's and its
        GPUs' locks, which the caller holds, keep the answers true until it releases them)."""
        with self.lock.hold():
            self._load()
            return {h.key: not (self.store.holders(h.key) - {entry.uid}) for h in entry.holds}

    def _undo(self, entry: PreparedClaim) -> None:
        """Undo a record; the caller holds the claim's and its GPUs' locks."""
        # The spec goes first: while the record remains, a missing spec makes a repeated prepare
        # restore everything (see _prepare), so a crash anywhere below is safe without a third phase.
        with self.lock.hold():
            self.specs.remove(entry.uid)
        self._hook("unprepare:cdi-removed")
        last = self._last_holders(entry)
        for hold in reversed(entry.holds):
            self._handler(hold).release(hold, self.node, last[hold.key])
        self._mig.release(entry.uid, self.inventory.gpus())
        self._hook("unprepare:holds-released")
        self._drop(entry.uid)
        self._hook("unprepare:checkpoint-removed")

    def _remove_leftovers(self, uid: str) -> None:
        """Files of a claim the checkpoint does not know (e.g. after it was rebuilt without the API).

        `uid` names one file or directory of ours (validated at the gRPC boundary, or read from the
        directory itself): nothing outside the CDI directory and the claims' directory is touched.
        """
        if not is_path_component(uid):
            raise PrepareError(
                f"refusing to remove files for the claim UID {uid[:64]!r}", reason="invalid_claim"
            )
        if self.specs.remove(uid):
            log.info("removed a leftover CDI spec", extra={"uid": uid})
        claim_dir = self.node.claim_dir(uid)
        if not claim_dir.exists():
            return
        remove_tree(claim_dir)
        log.info("removed a leftover claim directory", extra={"path": str(claim_dir)})

    # -- background duties -------------------------------------------------------------------------------
    def supervise(self) -> None:
        """Re-apply node-side setup that vanished behind our back (a crashed MPS control daemon)."""
        self._rebuild_if_lost()
        checked: set[str] = set()
        for entry in self.snapshot().claims.values():
            if entry.state != ClaimState.PREPARE_COMPLETED or entry.bootId != self.boot_id:
                continue
            for hold in entry.holds:
                if hold.key in checked:
                    continue
                checked.add(hold.key)
                gpu = hold.params.get("gpu")
                try:
                    handler = self._handler(hold)
                    if not gpu and handler.in_place(hold, self.node):
                        continue  # a claim's own files: looked at first without its lock, the common case
                    with self.gpu_locks.hold([str(gpu)] if gpu else [f"claim:{entry.uid}"]):
                        current = self._entry(entry.uid)
                        if current is None or all(h.key != hold.key for h in current.holds):
                            continue  # unprepared meanwhile
                        if handler.in_place(hold, self.node):
                            continue
                        log.warning(
                            "node-side setup is gone; re-applying",
                            extra={"hold": hold.key, "claim": entry.ref},
                        )
                        handler.apply(hold, self.node)
                        self.metrics.setup_repairs.labels(kind=hold.kind).inc()
                except Exception as exc:
                    log.error(
                        "re-applying node-side setup failed",
                        extra={"hold": hold.key, "error": bounded(describe(exc))},
                    )
        self.compact()
        self._refresh_metrics()  # another process's writes, read by this round's loads

    def collect_stale(self) -> None:
        """Undo records of claims that the API no longer has (or has under another UID, or not allocated).

        Every record is looked at, whatever its state and boot: the kubelet re-prepares the claims of
        the pods it restarts after a reboot (the others may never be unprepared), a rebuild may have
        re-adopted a claim the kubelet had already unprepared, and the lost last journal line of an
        unprepare leaves a completed record behind. The claims are listed once, after the records were
        read, so that a claim prepared meanwhile is not mistaken for a gone one; a record is undone
        only if it is still the one looked at once its locks are held. Without an answer from the API
        nothing is decided. A record it cannot undo is counted, logged and left for the next sweep;
        the sweep goes on. A record the kubelet itself will unprepare (prepared and completed in this
        boot) is undone only when two sweeps in a row found its claim gone, so that the kubelet's own
        call comes first when there is one. Then files no record accounts for are removed: claims'
        directories and specs, and the temporary files of interrupted writes.
        """
        checkpoint = self.snapshot()
        if checkpoint.rebuildPending:
            checkpoint = self._rebuild()
        failed: list[str] = []
        live = self._live_claims() if checkpoint.claims else {}
        suspects, self._gone_once = self._gone_once, set()
        for entry in checkpoint.claims.values():
            if live is None:
                self._gone_once = suspects
                break  # no answer from the API: nothing is decided
            obj = live.get((entry.namespace, entry.name))
            if obj is not None and objects.uid(obj) == entry.uid and self._allocated_here(obj):
                continue
            kubelets = entry.state == ClaimState.PREPARE_COMPLETED and entry.bootId == self.boot_id
            if kubelets and entry.uid not in suspects:
                self._gone_once.add(entry.uid)  # the kubelet's own unprepare may be on its way
                continue
            claim = ClaimInfo(uid=entry.uid, namespace=entry.namespace, name=entry.name)
            try:
                with self._claim_locked(claim, None) as current:
                    if current is not entry:
                        continue  # prepared again or undone meanwhile
                    log.info(
                        "undoing the record of a claim that is gone or no longer allocated here",
                        extra={
                            "claim": entry.ref,
                            "state": entry.state,
                            "boot": entry.bootId == self.boot_id,
                        },
                    )
                    self._undo(current)
            except Exception as exc:
                failed.append(entry.ref)
                log.warning(
                    "undoing a stale claim failed; its record stays and the next sweep tries again",
                    extra={"claim": entry.ref, "error": bounded(describe(exc))},
                )
        self.metrics.stale_uncleaned.set(len(failed))
        if not self.snapshot().rebuildPending:
            self._remove_unrecorded()
        self._refresh_metrics()

    def _live_claims(self) -> dict[tuple[str, str], dict[str, Any]] | None:
        """The API's ResourceClaims by (namespace, name); None when the API does not answer."""
        try:
            items, _ = self.api.list("ResourceClaim")
        except Exception as exc:  # API unreachable: decide next time
            log.warning(
                "cannot list ResourceClaims for the stale-claim sweep; will retry", extra={"error": str(exc)}
            )
            return None
        return {(objects.namespace(o), objects.name(o)): o for o in items}

    def _allocated_here(self, obj: Mapping[str, Any]) -> bool:
        """Whether the claim's allocation has a device of this driver in this node's pool (a claim the
        scheduler deallocated can be in no pod's use)."""
        return bool(allocation_results(obj, self.node.driver, self.pool))

    def _remove_unrecorded(self) -> None:
        """Claims' files no record accounts for, and temporary files of interrupted writes."""
        with self.lock.hold():
            known = set(self._load().claims)
            for uid in sorted(self._uids_on_disk() - known):
                try:
                    self._remove_leftovers(uid)
                except Exception as exc:
                    log.warning(
                        "could not remove a claim's leftover files; the next sweep tries again",
                        extra={"uid": uid[:64], "error": bounded(describe(exc))},
                    )
        cutoff = time.time() - TEMP_FILE_AGE_S
        temporary = [
            *self.specs.temp_files(),
            *claim_temp_files(self.node.state_dir / "claims"),
            *self._mig.temp_files(),
            *self.store.temp_files(),
        ]
        for path in temporary:
            try:
                if path.lstat().st_mtime < cutoff:
                    path.unlink()
                    log.info("removed the temporary file of an interrupted write", extra={"path": str(path)})
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning(
                    "could not remove the temporary file of an interrupted write",
                    extra={"error": filesystem_error("removing", path, exc).message},
                )

    def snapshot(self) -> Checkpoint:
        """The checkpoint as of now: a copy of the mapping of claims, sharing the (unchanging) records."""
        with self.lock.hold():
            checkpoint = self._load()
            return Checkpoint(claims=dict(checkpoint.claims), rebuildPending=checkpoint.rebuildPending)

    # -- rebuilding a lost checkpoint ---------------------------------------------------------------------
    def _rebuild(self) -> Checkpoint:
        """Complete the checkpoint from the API (claims allocated here and in use) and the disk.

        Claims in use are prepared again (idempotently: their settings and daemons are kept); files of
        other claims are removed and GPU-wide settings nobody holds are reset. Without the API nothing
        is removed and the checkpoint is marked `rebuildPending`: the next start or stale-claim sweep
        tries again, and meanwhile the kubelet's own unprepare calls clean up claim by claim. Takes
        the locks it needs claim by claim and GPU by GPU: call it holding none.
        """
        self._rebuild_wanted = False
        try:
            items, _ = self.api.list("ResourceClaim")
        except Exception as exc:  # ApiError or a transport failure: either way, no authoritative list
            log.error(
                "cannot list ResourceClaims to rebuild the state; will retry", extra={"error": str(exc)}
            )
            self._set_pending(True)
            return self.snapshot()
        for obj in items:
            meta, status = obj.get("metadata") or {}, obj.get("status") or {}
            if not status.get("reservedFor") or not allocation_results(obj, self.node.driver, self.pool):
                continue
            claim = ClaimInfo(
                uid=str(meta.get("uid")), namespace=str(meta.get("namespace")), name=str(meta.get("name"))
            )
            problem = claim_problem(claim.uid, claim.namespace, claim.name)
            if problem is not None:
                log.warning(
                    "not re-adopting a claim the API server should not have", extra={"error": problem}
                )
                continue
            try:
                with self._claim_locked(claim, obj) as entry:
                    if entry is not None:
                        continue
                    self._prepare_fresh(claim, obj)
                log.info("re-adopted a claim in use", extra={"claim": claim.ref})
            except Exception as exc:
                log.warning(
                    "could not re-adopt a claim", extra={"claim": claim.ref, "error": bounded(describe(exc))}
                )
            with self._notices_lock:
                self._notices.pop(claim.uid, None)  # told when it was first prepared
        with self.lock.hold():
            for uid in self._uids_on_disk() - set(self._load().claims):
                try:
                    self._remove_leftovers(uid)
                except Exception as exc:
                    log.warning("could not remove a claim's leftover files", extra={"error": describe(exc)})
        self._reset_unheld_gpus()
        self._set_pending(False)
        return self.snapshot()

    def _uids_on_disk(self) -> set[str]:
        claims_root = self.node.state_dir / "claims"
        dirs = {p.name for p in claims_root.iterdir()} if claims_root.is_dir() else set()
        return self.specs.uids_on_disk() | dirs

    def _reset_unheld_gpus(self) -> None:
        for gpu in self.inventory.gpus():
            try:
                with self.gpu_locks.hold([gpu.uuid]):
                    with self.lock.hold():
                        self._load()
                        held = self.store.held_keys()
                    for handler in self._handlers.values():
                        try:
                            handler.reset_unheld(gpu, self.node, held)
                        except CommandError as exc:
                            log.warning(
                                "could not reset a GPU setting nobody holds",
                                extra={"gpu": gpu.uuid, "kind": handler.kind, "error": str(exc)},
                            )
            except LockTimeout as exc:
                log.warning("could not reset the GPU's settings nobody holds", extra={"error": str(exc)})


def _reason(exc: BaseException) -> str:
    if isinstance(exc, PrepareError):
        return exc.reason
    if isinstance(exc, LockTimeout):
        return "lock_timeout"
    return "filesystem" if isinstance(exc, OSError) else "internal"
