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
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dra_gpu.inventory import GpuInfo, Inventory
from dra_gpu.kube import KubeAPI, NotFound
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
from dra_gpu.plugin.commands import CommandError
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.locking import GPU_LOCK_DIR_NAME, KeyLocks, LockTimeout, NodeLock
from dra_gpu.plugin.metrics import PluginMetrics
from dra_gpu.plugin.mig_devices import mig_views
from dra_gpu.plugin.mig_instances import MigInstances
from dra_gpu.plugin.sharing.plan import ClaimInfo, Holder, HoldHandler, NodeContext, Plan, Share
from dra_gpu.slices.devices import device_name as slice_device_name

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
NOT_REPORTED = frozenset({"claim_not_found", "api_error", "uid_mismatch"})
"""Failures with no claim to report on, or none the user can fix in it."""


def _drop(checkpoint: Checkpoint, uid: str) -> None:
    checkpoint.claims.pop(uid, None)


def _mark_pending(checkpoint: Checkpoint) -> None:
    checkpoint.rebuildPending = True


def _clear_pending(checkpoint: Checkpoint) -> None:
    checkpoint.rebuildPending = False


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

    # -- entry points ------------------------------------------------------------------------------
    def start(self) -> None:
        """Load (or rebuild) the checkpoint once, before the kubelet can call."""
        checkpoint = self._read()
        if checkpoint.rebuildPending or (not self.store.exists() and self.specs.uids_on_disk()):
            log.warning("rebuilding the state from the claims in the API and the files on disk")
            checkpoint = self._rebuild()
        else:
            with self.lock.hold():
                for uid in self._uids_on_disk() - set(self._load().claims):
                    # Specs and directories are created after their claim's record: these are from a lost write.
                    self._remove_leftovers(uid)
        current = self._read()
        if not current.rebuildPending:  # else the claims in use are not known yet: keep their instances
            self._mig.reconcile(set(current.claims), self.inventory.gpus())
        stale = [c.ref for c in checkpoint.claims.values() if c.bootId != self.boot_id]
        if stale:
            log.info(
                "the node rebooted since these claims were prepared; their CDI specs and GPU settings "
                "are restored when the kubelet prepares them again",
                extra={"claims": stale},
            )
        self.metrics.refresh(checkpoint)

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

    def prepare(self, claims: Sequence[ClaimInfo]) -> dict[str, PrepareResult]:
        started = time.perf_counter()
        self._rebuild_if_lost()
        results = {claim.uid: self._guarded("prepare", claim, self._prepare) for claim in claims}
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

    def unprepare(self, claims: Sequence[ClaimInfo]) -> dict[str, str]:
        started = time.perf_counter()
        self._rebuild_if_lost()
        errors = {claim.uid: self._guarded("unprepare", claim, self._unprepare).error for claim in claims}
        self._rebuild_if_lost()
        self._refresh_metrics()
        self.metrics.unprepare_seconds.observe(time.perf_counter() - started)
        return errors

    def _refresh_metrics(self) -> None:
        try:
            with self.lock.hold():
                self.metrics.refresh(self._load())
        except LockTimeout:
            pass  # the next call refreshes them

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
            self.metrics.errors.labels(operation=operation, reason=exc.reason).inc()
            log.warning(f"{operation} failed", extra={**fields, "reason": exc.reason, "error": exc.message})
            return PrepareResult(error=exc.message)
        except LockTimeout as exc:
            self.metrics.errors.labels(operation=operation, reason="lock_timeout").inc()
            log.warning(f"{operation} failed", extra={**fields, "reason": "lock_timeout", "error": str(exc)})
            return PrepareResult(error=str(exc))
        except Exception as exc:
            self.metrics.errors.labels(operation=operation, reason="internal").inc()
            log.exception(f"{operation} failed unexpectedly", extra=fields)
            return PrepareResult(error=f"internal error in the {self.node.driver} plugin: {exc!r}")
        log.info(f"{operation} done", extra={**fields, "devices": [d.device for d in devices]})
        return PrepareResult(devices=devices)

    # -- checkpoint ----------------------------------------------------------------------------------
    def _load(self) -> Checkpoint:
        """The checkpoint as stored; only under the node lock (the object is the store's own).

        A damaged file is set aside and an empty checkpoint marked `rebuildPending` takes its place.
        """
        try:
            return self.store.load()
        except CheckpointCorrupt as exc:
            moved = self.store.set_aside()
            log.error(
                "checkpoint cannot be trusted; set aside, rebuilding the state from disk and the API",
                extra={"reason": str(exc), "moved_to": str(moved)},
            )
            # The rebuild reads the API and sets GPUs up: it runs once the node lock is released.
            checkpoint = Checkpoint(rebuildPending=True)
            self._save(checkpoint)
            self._rebuild_wanted = True
            return checkpoint

    def _save(self, checkpoint: Checkpoint) -> None:
        self.store.save(checkpoint)

    def _read(self) -> Checkpoint:
        """A copy of the checkpoint, to look at without the node lock."""
        with self.lock.hold():
            return self._load().model_copy(deep=True)

    def _update(self, change: Callable[[Checkpoint], None]) -> None:
        """One read-modify-write of the checkpoint under the node lock."""
        with self.lock.hold():
            checkpoint = self._load()
            try:
                change(checkpoint)
                self._save(checkpoint)
            except BaseException:
                self.store.invalidate()
                raise

    def _entry(self, uid: str) -> PreparedClaim | None:
        entry = self._read().claims.get(uid)
        return entry

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
        self, claim: ClaimInfo, obj: Mapping[str, Any] | None
    ) -> Iterator[PreparedClaim | None]:
        """Hold the claim's and its GPUs' locks; yields the claim's record as it is under them.

        The GPUs come from the record read before locking; should the record have moved to other
        GPUs meanwhile (a concurrent call for the same claim in another plugin process), lock again.
        """
        entry = self._entry(claim.uid)
        for _ in range(3):
            wanted = self._gpu_uuids(entry, obj)
            with self.gpu_locks.hold({f"claim:{claim.uid}", *wanted}):
                current = self._entry(claim.uid)
                if self._gpu_uuids(current, obj) <= wanted:
                    yield current
                    return
                entry = current
        raise LockTimeout(f"claim {claim.ref}: its record kept changing GPUs while waiting for their locks")

    # -- prepare ---------------------------------------------------------------------------------------
    def _prepare(self, claim: ClaimInfo) -> list[PreparedDevice]:
        # The API read comes first, outside every lock: it can take as long as the API server's timeout.
        fetched: dict[str, Any] | None = None
        fetch_error: PrepareError | None = None
        try:
            fetched = fetch_claim(self.api, claim)
        except PrepareError as exc:
            fetch_error = exc
        try:
            return self._prepare_locked(claim, fetched, fetch_error)
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
        for consumer in ((obj or {}).get("status") or {}).get("reservedFor") or []:
            if consumer.get("resource") == "pods" and not consumer.get("apiGroup"):
                pod = {"name": consumer.get("name"), "namespace": claim.namespace, "uid": consumer.get("uid")}
                targets.append({"apiVersion": "v1", "kind": "Pod", "metadata": pod})
        for target in targets:
            try:
                self.events.record(target, "Warning", PREPARE_FAILED_REASON, exc.message)
            except Exception as error:  # an event is never worth failing or retrying the call for
                log.warning("could not record a prepare failure event", extra={"error": str(error)})

    def _prepare_locked(
        self, claim: ClaimInfo, fetched: dict[str, Any] | None, fetch_error: PrepareError | None
    ) -> list[PreparedDevice]:
        with self._claim_locked(claim, fetched) as entry:
            obj: dict[str, Any] | None = None
            if entry is not None and entry.state == ClaimState.PREPARE_COMPLETED:
                obj = self._reallocated(entry, fetched)
                if obj is None:
                    if entry.bootId == self.boot_id and self.specs.exists(claim.uid):
                        return entry.devices
                    return self._restore(entry)
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
            plan = self._plan(self._read(), claim, shares)
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
        self._update(lambda c: c.claims.__setitem__(claim.uid, entry.model_copy(deep=True)))
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

        def completed(checkpoint: Checkpoint) -> None:
            checkpoint.claims[claim.uid].state = ClaimState.PREPARE_COMPLETED

        self._update(completed)
        self._hook("prepare:checkpoint-completed")
        for text in plan.notices:
            log.warning("prepared with a caveat", extra={"claim": claim.ref, "notice": text})
        if plan.notices:
            with self._notices_lock:
                self._notices[claim.uid] = (obj, list(plan.notices))
        return entry.devices

    def _plan(self, checkpoint: Checkpoint, claim: ClaimInfo, shares: list[Share]) -> Plan:
        plan = Plan(claim=claim, shares=shares, driver=self.node.driver)
        for backend in self._backends:
            backend.contribute(plan, self.node)
        records = plan.share_records()
        for share in shares:
            if share.admin_access:
                continue
            others = [
                Holder(other.ref, record)
                for other in checkpoint.claims.values()
                if other.uid != claim.uid
                for record in other.shares
                if record.gpu == share.gpu.uuid and not record.adminAccess
            ]
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

        def booted(checkpoint: Checkpoint) -> None:
            if entry.uid in checkpoint.claims:
                checkpoint.claims[entry.uid].bootId = self.boot_id

        self._update(booted)
        return entry.devices

    def _rollback(self, entry: PreparedClaim, applied: list[Hold]) -> None:
        for hold in reversed(applied):
            try:
                self._handler(hold).release(hold, self.node, self._last_holder(entry, hold))
            except PrepareError as exc:
                log.error(
                    "rolling back a failed prepare left a setting behind",
                    extra={"claim": entry.ref, "error": str(exc)},
                )
                return  # keep the record: the kubelet's next call retries the undo
        self._mig.release(entry.uid, self.inventory.gpus())
        with self.lock.hold():
            self.specs.remove(entry.uid)
            self._update(lambda c: _drop(c, entry.uid))

    # -- unprepare -------------------------------------------------------------------------------------
    def _unprepare(self, claim: ClaimInfo) -> list[PreparedDevice]:
        with self._claim_locked(claim, None) as entry:
            if entry is None:
                with self.lock.hold():
                    if claim.uid not in self._load().claims:
                        self._remove_leftovers(claim.uid)
                return []
            self._undo(entry)
            return []

    def _last_holder(self, entry: PreparedClaim, hold: Hold) -> bool:
        """Whether no other claim holds `hold`'s setting (its GPU's lock keeps the answer true)."""
        return not any(
            h.key == hold.key
            for other in self._read().claims.values()
            if other.uid != entry.uid
            for h in other.holds
        )

    def _undo(self, entry: PreparedClaim) -> None:
        """Undo a record; the caller holds the claim's and its GPUs' locks."""
        # The spec goes first: while the record remains, a missing spec makes a repeated prepare
        # restore everything (see _prepare), so a crash anywhere below is safe without a third phase.
        with self.lock.hold():
            self.specs.remove(entry.uid)
        self._hook("unprepare:cdi-removed")
        for hold in reversed(entry.holds):
            self._handler(hold).release(hold, self.node, self._last_holder(entry, hold))
        self._mig.release(entry.uid, self.inventory.gpus())
        self._hook("unprepare:holds-released")
        self._update(lambda c: _drop(c, entry.uid))
        self._hook("unprepare:checkpoint-removed")

    def _remove_leftovers(self, uid: str) -> None:
        """Files of a claim the checkpoint does not know (e.g. after it was rebuilt without the API)."""
        if self.specs.remove(uid):
            log.info("removed a leftover CDI spec", extra={"uid": uid})
        claim_dir = self.node.claim_dir(uid)
        if claim_dir.exists():
            shutil.rmtree(claim_dir, ignore_errors=True)
            log.info("removed a leftover claim directory", extra={"path": str(claim_dir)})

    # -- background duties -------------------------------------------------------------------------------
    def supervise(self) -> None:
        """Re-apply node-side setup that vanished behind our back (a crashed MPS control daemon)."""
        self._rebuild_if_lost()
        checkpoint = self._read()
        checked: set[str] = set()
        for entry in checkpoint.claims.values():
            if entry.state != ClaimState.PREPARE_COMPLETED or entry.bootId != self.boot_id:
                continue
            for hold in entry.holds:
                if hold.key in checked:
                    continue
                checked.add(hold.key)
                handler = self._handler(hold)
                gpu = hold.params.get("gpu")
                try:
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
                except (PrepareError, LockTimeout) as exc:
                    log.error(
                        "re-applying node-side setup failed", extra={"hold": hold.key, "error": str(exc)}
                    )

    def collect_stale(self) -> None:
        """Undo records of claims that no longer exist and that the kubelet will not unprepare.

        That is interrupted prepares, and records from before a reboot (the kubelet re-prepares the
        claims of the pods it restarts; the others may never be unprepared).
        """
        checkpoint = self._read()
        if checkpoint.rebuildPending:
            checkpoint = self._rebuild()
        for entry in list(checkpoint.claims.values()):
            if entry.state == ClaimState.PREPARE_COMPLETED and entry.bootId == self.boot_id:
                continue
            try:
                obj = self.api.get("ResourceClaim", entry.name, entry.namespace)
                if (obj.get("metadata") or {}).get("uid") == entry.uid:
                    continue
            except NotFound:
                pass
            except Exception:  # API unreachable: decide next time
                continue
            claim = ClaimInfo(uid=entry.uid, namespace=entry.namespace, name=entry.name)
            try:
                with self._claim_locked(claim, None) as current:
                    if current is None or (
                        current.state == ClaimState.PREPARE_COMPLETED and current.bootId == self.boot_id
                    ):
                        continue  # prepared again meanwhile
                    log.info(
                        "undoing an interrupted operation of a deleted claim", extra={"claim": entry.ref}
                    )
                    self._undo(current)
            except (PrepareError, LockTimeout) as exc:
                log.error("undoing a stale claim failed", extra={"claim": entry.ref, "error": str(exc)})
        self._refresh_metrics()

    def snapshot(self) -> Checkpoint:
        return self._read()

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
            self._update(_mark_pending)
            return self._read()
        for obj in items:
            meta, status = obj.get("metadata") or {}, obj.get("status") or {}
            if not status.get("reservedFor") or not allocation_results(obj, self.node.driver, self.pool):
                continue
            claim = ClaimInfo(
                uid=str(meta.get("uid")), namespace=str(meta.get("namespace")), name=str(meta.get("name"))
            )
            try:
                with self._claim_locked(claim, obj) as entry:
                    if entry is not None:
                        continue
                    self._prepare_fresh(claim, obj)
                log.info("re-adopted a claim in use", extra={"claim": claim.ref})
            except (PrepareError, LockTimeout) as exc:
                log.warning("could not re-adopt a claim", extra={"claim": claim.ref, "error": str(exc)})
            with self._notices_lock:
                self._notices.pop(claim.uid, None)  # told when it was first prepared
        with self.lock.hold():
            for uid in self._uids_on_disk() - set(self._load().claims):
                self._remove_leftovers(uid)
        self._reset_unheld_gpus()
        self._update(_clear_pending)
        return self._read()

    def _uids_on_disk(self) -> set[str]:
        claims_root = self.node.state_dir / "claims"
        dirs = {p.name for p in claims_root.iterdir()} if claims_root.is_dir() else set()
        return self.specs.uids_on_disk() | dirs

    def _reset_unheld_gpus(self) -> None:
        for gpu in self.inventory.gpus():
            try:
                with self.gpu_locks.hold([gpu.uuid]):
                    held = {h.key for c in self._read().claims.values() for h in c.holds}
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
