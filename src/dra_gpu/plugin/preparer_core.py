"""What every part of the preparer shares: the checkpoint read and written under the node lock, the claim
and GPU locks, the handlers of node-side holds, the fault hook.

`PreparerCore` is one object that the parts (`prepare.Prepare`, `unprepare.Unprepare`, `calls.Calls`,
`sweeps.Sweeps`, `rebuild.Rebuild`) are each given; `preparer.Preparer` builds them all once and is what
the server calls. The locking and crash-safety rules they all follow are in `prepare.py`'s docstring.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from dra_gpu import devicekinds
from dra_gpu.inventory import GpuInfo, Inventory
from dra_gpu.kube import KubeAPI
from dra_gpu.kube.events import EventRecorder
from dra_gpu.plugin import sharing
from dra_gpu.plugin.cdi_specs import ClaimSpecs
from dra_gpu.plugin.checkpoint import (
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    Hold,
    PreparedClaim,
)
from dra_gpu.plugin.claims import results_in_pool
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.identity import is_path_component
from dra_gpu.plugin.locking import CLAIM_LOCK_DIR_NAME, GPU_LOCK_DIR_NAME, KeyLocks, LockTimeout, NodeLock
from dra_gpu.plugin.metrics import PluginMetrics
from dra_gpu.plugin.sharing.plan import ClaimInfo, HoldHandler, NodeContext
from dra_gpu.plugin.sharing.steps.directories import remove_tree
from dra_gpu.vocabulary.device import device_name as slice_device_name

log = logging.getLogger(__name__)

FaultHook = Callable[[str], None]

EVENT_COMPONENT = "dra-gpu-kubelet-plugin"

COMPACT_IN_CALL_FACTOR = 8
"""A call folds the checkpoint's journal into its snapshot itself only when the background did not."""


def device_name(gpu: GpuInfo) -> str:
    """The GPU's device name in the node's pool, as the slice publisher writes it."""
    return slice_device_name(gpu.index)


class PreparerCore:
    """The preparer's shared state: its checkpoint, its locks and the handlers of node-side holds."""

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
        self.gpu_locks = gpu_locks or KeyLocks(
            lock.path.parent / GPU_LOCK_DIR_NAME, lock.timeout_s, node.state_dir / CLAIM_LOCK_DIR_NAME
        )
        self.specs = specs
        self.pool = pool
        self.boot_id = boot_id
        self.metrics = metrics or PluginMetrics()
        self.events = events or EventRecorder(api, pool, lambda: datetime.now(UTC), component=EVENT_COMPONENT)
        self._hook = fault_hook or (lambda _step: None)
        self.handlers = sharing.hold_handlers()
        """Hold kind -> the handler that applies and releases it."""
        self.rebuild_wanted = False
        """A damaged checkpoint was set aside: the next call rebuilds the state before its own work."""
        self._metrics_reloads = -1
        """The store's `reloads` the metrics were last computed for (they follow each write since)."""
        self._loaded: tuple[int, Checkpoint] | None = None
        """(the node lock's hold, the checkpoint loaded under it)."""

    def step(self, name: str) -> None:
        """Passed a point between the steps of prepare or unprepare (`prepare.STEPS`): the fault hook."""
        self._hook(name)

    def refresh_metrics(self, force: bool = False) -> None:
        """Recount the gauges if the checkpoint was read anew since (each write updates them itself).

        Another process's writes are found by the next load (every call loads): a call that ends with
        `reloads` unchanged changed nothing the metrics did not follow."""
        if not force and self.store.reloads == self._metrics_reloads:
            return  # the common case: this process's own writes, which the metrics followed
        try:
            with self.lock.hold():
                checkpoint = self.load()
                if force or self.store.reloads != self._metrics_reloads:
                    self.metrics.refresh(checkpoint)
                    self._metrics_reloads = self.store.reloads
        except Exception as exc:  # the next call refreshes them; never this call's failure
            log.debug("metrics not refreshed", extra={"error": str(exc)})

    def load(self) -> Checkpoint:
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
            self.rebuild_wanted = True
            self.metrics.refresh(checkpoint)
            return checkpoint

    def put(self, record: PreparedClaim) -> None:
        """Store one claim's record (a new object: stored records are never changed in place)."""
        with self.lock.hold():
            before = self.load().claims.get(record.uid)
            self.store.put(record, loaded=True)
            self.metrics.claim_changed(before, record)
            self.compact_if_overdue()

    def drop(self, uid: str) -> None:
        with self.lock.hold():
            before = self.load().claims.get(uid)
            if before is None:
                return
            self.store.drop(uid, loaded=True)
            self.metrics.claim_changed(before, None)
            self.compact_if_overdue()

    def set_pending(self, value: bool) -> None:
        with self.lock.hold():
            if self.load().rebuildPending != value:
                self.store.set_rebuild_pending(value)

    def compact_if_overdue(self) -> None:
        """The background folds the journal in; a call does it only if the journal got far too long."""
        if self.store.compact_due(COMPACT_IN_CALL_FACTOR):
            self.store.compact()

    def compact(self) -> None:
        """Fold the checkpoint's journal into its snapshot once it has outgrown it (background duty)."""
        with self.lock.hold():
            self.load()
            if self.store.compact_due():
                self.store.compact()

    def entry(self, uid: str) -> PreparedClaim | None:
        with self.lock.hold():
            return self.load().claims.get(uid)

    def gpu_uuids(self, entry: PreparedClaim | None, obj: Mapping[str, Any] | None) -> set[str]:
        """The GPUs a call on this claim may touch: those of its record and of its allocation here."""
        uuids = {s.gpu for s in entry.shares} if entry is not None else set()
        uuids |= {
            str(h.params["gpu"]) for h in (entry.holds if entry is not None else []) if "gpu" in h.params
        }
        if obj is not None:
            gpus = self.gpus()
            for result in results_in_pool(obj, self.node.driver, self.pool):
                gpu = gpus.get(result.device)
                if gpu is not None:
                    uuids.add(gpu.uuid)
        return uuids

    @contextmanager
    def claim_locked(
        self, claim: ClaimInfo, obj: Mapping[str, Any] | None, deadline: float | None = None
    ) -> Iterator[PreparedClaim | None]:
        """Hold the claim's and its GPUs' locks; yields the claim's record as it is under them.

        A record of the UID under another namespace or name is never yielded (PrepareError): a call
        naming a prepared claim's UID with another claim's name gets neither its devices nor its undoing.

        The GPUs come from the record read before locking; should the record have moved to other
        GPUs meanwhile (a concurrent call for the same claim in another plugin process), lock again.
        Waiting ends at `deadline` too (LockTimeout): the claim is then left as it was.
        """
        entry = self.entry(claim.uid)
        for _ in range(3):
            wanted = self.gpu_uuids(entry, obj)
            with self.gpu_locks.hold({f"claim:{claim.uid}", *wanted}, deadline=deadline):
                current = self.entry(claim.uid)
                if current is not None and (current.namespace, current.name) != (claim.namespace, claim.name):
                    raise PrepareError(
                        f"the claim UID {claim.uid} was prepared on this node as ResourceClaim {current.ref}, "
                        f"not {claim.ref}: nothing was changed (a UID names one claim)",
                        reason="identity_mismatch",
                    )
                if self.gpu_uuids(current, obj) <= wanted:
                    yield current
                    return
                entry = current
        raise LockTimeout(f"claim {claim.ref}: its record kept changing GPUs while waiting for their locks")

    def last_holders(self, entry: PreparedClaim) -> dict[str, bool]:
        """For each hold of `entry`, whether no other claim holds its setting (the claim's and its
        GPUs' locks, which the caller holds, keep the answers true until it releases them)."""
        with self.lock.hold():
            self.load()
            return {h.key: not (self.store.holders(h.key) - {entry.uid}) for h in entry.holds}

    def handler(self, hold: Hold) -> HoldHandler:
        handler = self.handlers.get(hold.kind)
        if handler is None:
            raise PrepareError(
                f"the checkpoint records node-side setup of kind {hold.kind!r} ({hold.key}), which this "
                f"version of the plugin cannot apply or undo; run the plugin version that prepared the claim",
                reason="unknown_setup",
            )
        return handler

    def gpus(self) -> dict[str, GpuInfo]:
        gpus = self.inventory.gpus()
        return devicekinds.views(gpus)

    def remove_leftovers(self, uid: str) -> None:
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

    def snapshot(self) -> Checkpoint:
        """The checkpoint as of now: a copy of the mapping of claims, sharing the (unchanging) records."""
        with self.lock.hold():
            checkpoint = self.load()
            return Checkpoint(claims=dict(checkpoint.claims), rebuildPending=checkpoint.rebuildPending)

    def uids_on_disk(self) -> set[str]:
        claims_root = self.node.state_dir / "claims"
        dirs = {p.name for p in claims_root.iterdir()} if claims_root.is_dir() else set()
        return self.specs.uids_on_disk() | dirs
