"""The node's ResourceSlice publisher: keeps this node's pool equal to its GPUs, whatever happens to it.

Three background threads, each with one job:

- the reconciler publishes the pool now, then again whenever something asks for it (and every
  `resync_s` regardless), with a short debounce so that a burst of events causes one reconcile;
- the watcher watches this node's slices of this driver (`spec.nodeName=<node>,spec.driver=<driver>`)
  and asks for a reconcile when someone else deletes or changes one: the kubelet deletes every slice of
  its node when it starts and a driver's slices when no plugin of it has been connected for 30 s, so
  the pool comes back within about a second; an expired watch re-lists;
- the health poller waits for GPU health events and asks for a reconcile that taints (or untaints)
  the GPU.

A GPU's shareability (`allowMultipleAllocations`) never flips while claims are allocated on it: the
scheduler could otherwise hand a GPU with live shares to an exclusive claim (fixed in the scheduler
only from 1.38). When the configured sharing mode of such a GPU changes, the publisher keeps
publishing its previous mode, warns which claims it waits for, looks again every `pending_poll_s`,
and publishes the new mode once they are gone. Live claims are the allocations naming the device in
the API, plus what the node agent still has prepared (its checkpoint), so that neither an allocated
but not yet started claim nor a running one is missed.

A reconcile compares each slice it writes with what the API server returns. When the server dropped
`allowMultipleAllocations`/`requestPolicy` (DRAConsumableCapacity off), it warns and publishes every
GPU unshared; when it dropped taints (DRADeviceTaints off), it leaves unhealthy GPUs out of the pool
until they recover, since it cannot keep new claims away from them any other way. When it dropped
shared counters (DRAPartitionableDevices off), or refused the counter layout (1.34's counter rules
differ), each dynamic MIG GPU offers its full profile only, so that no two overlapping instances can be
allocated; the reason is logged, kept in `fallbacks` and posted as a Warning event on the Node. On a
server whose release has DRADeviceCompatibilityGroups on by default (1.38+, from `GET /version`), counter
consumptions carry KEP-5963 compatibility groups (`slices.devices.with_compatibility_groups`); a server
that drops them (the gate switched off) gets today's slices again, said once in the log and `fallbacks`.

Longer than 500 lines: three threads around one state (the pool, its fallbacks, the mode changes waiting for
claims to go) under one lock; split, the locking would be spread over modules.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dra_gpu import DRIVER_NAME, devicekinds
from dra_gpu.config import GpuSharingMode, NodeSharing
from dra_gpu.inventory.types import GpuInfo, Inventory
from dra_gpu.kube import (
    AlreadyExists,
    Conflict,
    Forbidden,
    Gone,
    KubeAPI,
    NotFound,
    WatchEvent,
    builders,
    objects,
    versions,
)
from dra_gpu.kube.errors import Invalid
from dra_gpu.kube.events import EventRecorder
from dra_gpu.kube.validation import driver_name_errors, slice_errors
from dra_gpu.slices.devices import SHAREABLE_MODES, device_errors, unhealthy_taint, with_compatibility_groups
from dra_gpu.slices.dropped import (
    COMPATIBILITY_GROUPS,
    CONSUMABLE_CAPACITY,
    DEVICE_TAINTS,
    PARTITIONABLE_DEVICES,
    DroppedFields,
    dropped_fields,
)
from dra_gpu.slices.pool import (
    MAX_DEVICES_PER_SLICE,
    generate_name,
    plan_pool,
    split_counter_sets,
    split_devices,
    with_pool,
)
from dra_gpu.vocabulary.device import SHARING_ATTRIBUTE, device_name

Obj = dict[str, Any]
log = logging.getLogger(__name__)

KIND = "ResourceSlice"
EVENT_COMPONENT = "dra-gpu-kubelet-plugin"
NO_COUNTERS_REASON = "DynamicMigWithoutCounters"


class SliceError(ValueError):
    """A slice the API server would refuse; the message carries the server's wording."""


LiveClaims = Mapping[str, Mapping[str, bool]]
"""Device name -> the claims (`namespace/name`) that hold it -> whether it was allocated as a share."""


@dataclass(frozen=True)
class PendingModeChange:
    """A sharing-mode change that waits, because it would flip shareability under live claims."""

    published: GpuSharingMode
    wanted: GpuSharingMode
    claims: tuple[str, ...]


@dataclass
class PublisherStats:
    syncs: int = 0
    creates: int = 0
    updates: int = 0
    deletes: int = 0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SlicePublisher:
    """Publishes the pool `node_name` of `driver` from `inventory`, with per-GPU modes from `sharing`."""

    def __init__(
        self,
        api: KubeAPI,
        node_name: str,
        inventory: Inventory,
        sharing: NodeSharing,
        driver: str = DRIVER_NAME,
        *,
        devices_per_slice: int = MAX_DEVICES_PER_SLICE,
        debounce_s: float = 0.2,
        resync_s: float = 600.0,
        watch_timeout_s: float = 300.0,
        health_poll_s: float = 1.0,
        pending_poll_s: float = 10.0,
        prepared_claims: Callable[[], LiveClaims] | None = None,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.inventory = inventory
        self.sharing = sharing
        self.driver = driver
        self.devices_per_slice = devices_per_slice
        self.debounce_s = debounce_s
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self.health_poll_s = health_poll_s
        self.pending_poll_s = pending_poll_s
        self.prepared_claims = prepared_claims
        """The node agent's prepared claims per device (its checkpoint); None outside the agent."""
        self.pending: dict[str, PendingModeChange] = {}
        """Devices whose mode change waits for their claims to go (see the module docstring)."""
        self._published_modes: dict[str, tuple[bool, GpuSharingMode]] = {}
        """What this process last published per device, for when the kubelet wiped the pool."""
        self.consumable_capacity = True
        """False once the API server was seen dropping shared-device fields."""
        self.device_taints = True
        """False once the API server was seen dropping device taints."""
        self.partitionable_devices = True
        """False once the API server was seen dropping shared counters, or refusing their layout."""
        self.compatibility_groups: bool | None = None
        """Whether counter consumptions carry KEP-5963 compatibility groups: decided on the first reconcile
        from the server's version (on where DRADeviceCompatibilityGroups is on by default, 1.38+), False
        once the server was seen dropping them."""
        self.fallbacks: dict[str, str] = {}
        """Feature gate -> why the publisher stopped using it (what `/status` and the events say)."""
        self._events = EventRecorder(api, node_name, lambda: datetime.now(UTC), component=EVENT_COMPONENT)
        self.stats = PublisherStats()
        self.last_error: str | None = None
        self.published = threading.Event()
        """Set after the first successful reconcile (readiness)."""
        self._sync_lock = threading.RLock()
        self._seen_lock = threading.Lock()
        self._stop = threading.Event()
        self._dirty = threading.Event()
        self._threads: list[threading.Thread] = []
        self._own_versions: dict[str, str] = {}
        self._own_deletes: set[str] = set()
        self._unhealthy_since: dict[str, str] = {}
        self._node_uid: str | None = None
        self._published_health: list[tuple[str, bool, str]] | None = None
        self._warned: set[str] = set()
        self._counter_sets: list[Obj] = []
        self._syncing_since: float | None = None
        """When the background's reconcile in progress began (time.monotonic); None between them."""

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={self.driver}"

    # -- one reconcile -----------------------------------------------------------------------------
    def sync(self) -> list[Obj]:
        """Make the pool match the GPUs now; return its slices as the API server stored them."""
        with self._sync_lock:
            conflicts = 0
            while True:
                try:
                    stored, dropped = self._reconcile()
                except Invalid as exc:
                    if self._refused_counters(exc):
                        continue
                    raise
                except (Conflict, AlreadyExists, NotFound) as exc:
                    conflicts += 1  # someone wrote meanwhile (the kubelet wiping): plan again
                    if conflicts >= 3:
                        raise
                    log.debug(
                        "slice write raced with another writer; planning again", extra={"error": str(exc)}
                    )
                    continue
                self.stats.syncs += 1
                if dropped and self._fall_back(dropped):
                    continue
                self.last_error = None
                self.published.set()
                return stored

    def _reconcile(self) -> tuple[list[Obj], DroppedFields]:
        owner_references = self._owner_references()
        listed, _ = self.api.list(KIND, field_selector=self.field_selector)
        ours = [s for s in listed if objects.pool_name(s) == self.node_name]
        foreign_pools = [s for s in listed if s not in ours]
        published = {**self._published_modes, **_published_shareability(ours)}
        devices = self._devices(published)
        if self._use_compatibility_groups():
            devices = with_compatibility_groups(devices)
        chunks = split_devices(devices, self.devices_per_slice)
        specs = [builders.slice_spec(self.driver, self.node_name, self.node_name, devices=c) for c in chunks]
        specs += [  # dynamic MIG GPUs' counters, each chunk in a slice of its own (1.35+)
            builders.slice_spec(self.driver, self.node_name, self.node_name, shared_counters=c)
            for c in split_counter_sets(self._counter_sets)
        ]
        plan = plan_pool(ours, specs, owner_references)
        plan.delete.extend(foreign_pools)

        bodies: dict[int, Obj] = {}
        for index in [*plan.update, *plan.create]:
            spec = with_pool(specs[index], plan.generation, plan.slice_count)
            if index in plan.update:
                body = builders.with_spec(plan.update[index], spec, owner_references)
            else:
                body = builders.resource_slice(
                    spec,
                    generate_name=generate_name(index, plan.slice_count, self.driver, self.node_name),
                    owner_references=owner_references,
                )
            self._check(body, index)
            bodies[index] = body

        for obsolete in plan.delete:
            obsolete_name = objects.name(obsolete)
            with self._seen_lock:
                self._own_deletes.add(obsolete_name)
            try:
                self.api.delete(
                    KIND,
                    obsolete_name,
                    uid=objects.uid(obsolete) or None,
                    resource_version=objects.resource_version(obsolete) or None,
                )
                self.stats.deletes += 1
            except NotFound:  # already gone: its DELETED event was someone else's
                with self._seen_lock:
                    self._own_deletes.discard(obsolete_name)
        stored = dict(plan.keep)
        dropped = DroppedFields()
        # Counter slices first: a server that drops counters shows it before any placement that needs
        # them is written; the writes stop there, and the pool stays incomplete (unusable) until the
        # fallback publishes it again, so no uncounted placement is ever offered.
        for index in sorted(bodies, key=lambda i: (not objects.shared_counters(bodies[i]), i)):
            body = bodies[index]
            if index in plan.update:
                result = self.api.update(KIND, body)
                self.stats.updates += 1
            else:
                result = self.api.create(KIND, body)
                self.stats.creates += 1
            with self._seen_lock:
                self._own_versions[objects.name(result)] = objects.resource_version(result)
            stored[index] = result
            missing = dropped_fields(body, result)
            dropped.features |= missing.features
            dropped.paths += [f"slice {index}: {p}" for p in missing.paths]
            if PARTITIONABLE_DEVICES in missing.features and self.partitionable_devices:
                break
        with self._seen_lock:
            self._own_versions = {objects.name(s): objects.resource_version(s) for s in stored.values()}
        if plan.writes:
            log.info(
                "published ResourceSlices",
                extra={
                    "node": self.node_name,
                    "generation": plan.generation,
                    "slices": plan.slice_count,
                    "slices_created": len(plan.create),
                    "updated": len(plan.update),
                    "deleted": len(plan.delete),
                },
            )
        return [stored[i] for i in sorted(stored)], dropped

    def _use_compatibility_groups(self) -> bool:
        if self.compatibility_groups is None:  # read once (again next sync while it cannot be read)
            version = versions.server_version(self.api)
            if version is None:
                return False
            self.compatibility_groups = versions.gate_default(COMPATIBILITY_GROUPS, version)
        return self.compatibility_groups and self.partitionable_devices

    def _check(self, body: Obj, index: int) -> None:
        errors = slice_errors(body)
        for i, device in enumerate(objects.slice_devices(body)):
            errors += device_errors(device, f"spec.devices[{i}]")
            errors += driver_name_errors(device, self.driver, f"spec.devices[{i}]")
        if errors:
            raise SliceError(
                f"slice {index} of pool {self.node_name!r} would be refused: " + "; ".join(errors)
            )

    def _fall_back(self, dropped: DroppedFields) -> bool:
        """Stop sending what the server drops; True if the next reconcile publishes something else."""
        changed = False
        if CONSUMABLE_CAPACITY in dropped.features and self.consumable_capacity:
            self.consumable_capacity = False
            changed = True
            log.warning(
                "the API server dropped the shared-device fields (DRAConsumableCapacity is off): publishing "
                "every GPU unshared, so each claim gets a whole GPU; enable DRAConsumableCapacity to share",
                extra={"node": self.node_name, "dropped": dropped.describe()},
            )
        if DEVICE_TAINTS in dropped.features and self.device_taints:
            self.device_taints = False
            changed = True
            log.warning(
                "the API server dropped device taints (DRADeviceTaints is off): unhealthy GPUs are left out "
                "of the pool until they recover",
                extra={"node": self.node_name, "dropped": dropped.describe()},
            )
        if COMPATIBILITY_GROUPS in dropped.features and self.compatibility_groups:
            self.compatibility_groups = False
            changed = True
            reason = (
                "the API server dropped the counter consumptions' compatibilityGroups "
                "(DRADeviceCompatibilityGroups is off): publishing without them, as on Kubernetes 1.37 and "
                "older (MIG placements are allocated the same)"
            )
            self.fallbacks[COMPATIBILITY_GROUPS] = reason
            log.warning(reason, extra={"node": self.node_name, "dropped": dropped.describe()})
        if PARTITIONABLE_DEVICES in dropped.features and self.partitionable_devices:
            changed = True
            self._no_counters(
                "the API server dropped sharedCounters/consumesCounters (DRAPartitionableDevices is off)"
            )
        if not changed:
            self._warn_once("dropped:" + dropped.describe(), dropped.describe())
        return changed

    def _refused_counters(self, exc: Invalid) -> bool:
        """A refusal of the counter layout (a server whose counter rules differ, 1.34): publish without
        counters. True if the next reconcile publishes something else."""
        if not self.partitionable_devices or not self._counter_sets:
            return False
        if "sharedCounters" not in str(exc) and "consumesCounters" not in str(exc):
            return False
        self._no_counters(f"the API server refused the shared-counter layout ({exc})")
        return True

    def _no_counters(self, why: str) -> None:
        self.partitionable_devices = False
        reason = (
            f"{why}: each dynamic MIG GPU is published as its full profile only (one instance per GPU), so "
            f"that overlapping instances are never allocated; smaller instances need Kubernetes 1.35+ with "
            f"DRAPartitionableDevices on (or static MIG instances)"
        )
        self.fallbacks[PARTITIONABLE_DEVICES] = reason
        log.warning(reason, extra={"node": self.node_name})
        if self._node_uid is not None:
            node = builders.subject("Node", self.node_name, None, self._node_uid)
            self._events.record(node, "Warning", NO_COUNTERS_REASON, reason)

    @staticmethod
    def _health_of(gpus: list[GpuInfo]) -> list[tuple[str, bool, str]]:
        return [(g.uuid, g.healthy, g.health_reason) for g in gpus]

    def _devices(self, published: Mapping[str, tuple[bool, GpuSharingMode]]) -> list[Obj]:
        now = _now()
        devices = []
        gpus = self.inventory.gpus()
        self._counter_sets = devicekinds.counter_sets(gpus) if self.partitionable_devices else []
        self._published_health = self._health_of(gpus)
        live: LiveClaims | str | None = None
        pending: dict[str, PendingModeChange] = {}
        for gpu in gpus:
            configured = self.sharing.mode_for(gpu.index, gpu.uuid)
            mode = devicekinds.GPU.published_mode(gpu, configured)
            name = device_name(gpu.index)
            record = published.get(name)
            if self.consumable_capacity and (record is None or record[0] != (mode in SHAREABLE_MODES)):
                if live is None:
                    live = self._live_claims()
                held = _held(live, name, record)
                if held is not None and held[0] != (mode in SHAREABLE_MODES):
                    was_mode, holders = held[1], held[2]
                    pending[name] = PendingModeChange(was_mode, mode, holders)
                    mode = was_mode
            self._published_modes[name] = (mode in SHAREABLE_MODES and self.consumable_capacity, mode)
            taints = None
            if gpu.healthy:
                if self._unhealthy_since.pop(gpu.uuid, None) is not None:
                    log.info(
                        "GPU recovered", extra={"node": self.node_name, "gpu": gpu.index, "uuid": gpu.uuid}
                    )
            else:
                if gpu.uuid not in self._unhealthy_since:
                    self._unhealthy_since[gpu.uuid] = now
                    log.warning(
                        "GPU unhealthy: tainting it so that no new claim lands on it",
                        extra={
                            "node": self.node_name,
                            "gpu": gpu.index,
                            "uuid": gpu.uuid,
                            "reason": gpu.health_reason,
                        },
                    )
                if not self.device_taints:
                    continue
                taints = [unhealthy_taint(gpu.health_reason or "Unhealthy", self._unhealthy_since[gpu.uuid])]
            publish = devicekinds.Publish(
                configured, mode, self.consumable_capacity, self.partitionable_devices, taints
            )
            devices.extend(devicekinds.published_devices(gpu, publish))
            for key, message in devicekinds.unpublished(gpu):
                self._warn_once(key, f"GPU {gpu.index}: {message}")
        self._report_pending(pending)
        return devices

    def _report_pending(self, pending: dict[str, PendingModeChange]) -> None:
        for name, change in pending.items():
            if self.pending.get(name) != change:
                log.warning(
                    "sharing mode change waits: the GPU keeps its published mode (and whether it can be "
                    "shared) until the claims allocated on it are gone",
                    extra={
                        "node": self.node_name,
                        "device": name,
                        "published_mode": change.published.value,
                        "configured_mode": change.wanted.value,
                        "claims": list(change.claims),
                    },
                )
        for name, change in self.pending.items():
            if name not in pending:
                log.info(
                    "sharing mode change applied: no claim holds the GPU any more",
                    extra={"node": self.node_name, "device": name, "mode": change.wanted.value},
                )
        self.pending = pending

    def _live_claims(self) -> LiveClaims | str:
        """Claims that hold each device of this pool: allocated in the API or still prepared here.

        When the claims cannot be listed, a string saying so: every device counts as held by it.
        """
        live: dict[str, dict[str, bool]] = {}
        try:
            claims, _ = self.api.list("ResourceClaim")
        except Exception as exc:
            self._warn_once(
                "claims",
                f"cannot list ResourceClaims ({exc}): a GPU whose sharing mode changed keeps its published "
                "mode until they can be read",
            )
            return f"unknown (cannot list ResourceClaims: {exc})"
        for claim in claims:
            ref = f"{objects.namespace(claim)}/{objects.name(claim)}"
            allocation = objects.allocation(claim) or {}
            for result in objects.device_results(allocation):
                if result.driver == self.driver and result.pool == self.node_name:
                    holders = live.setdefault(result.device, {})
                    holders[ref] = holders.get(ref, False) or result.share_id is not None
        if self.prepared_claims is not None:
            try:
                prepared = self.prepared_claims()
            except Exception as exc:  # the node lock timed out, say: decide on the next look
                return f"unknown (cannot read the claims prepared on this node: {exc})"
            for name, refs in prepared.items():
                holders = live.setdefault(name, {})
                for ref, is_share in refs.items():
                    holders[ref] = holders.get(ref, False) or is_share
        return live

    def _owner_references(self) -> list[Obj] | None:
        if self._node_uid is None:
            try:
                node = self.api.get("Node", self.node_name)
            except (NotFound, Forbidden) as exc:
                self._warn_once(
                    "node",
                    f"cannot read Node {self.node_name!r} ({exc}): publishing without an owner reference, so "
                    "the slices are not garbage-collected with the Node",
                )
                return None
            self._node_uid = objects.uid(node)
        return [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": self._node_uid,
                "controller": True,
            }
        ]

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, extra={"node": self.node_name})

    # -- background loops --------------------------------------------------------------------------
    def start(self) -> None:
        """Publish now and keep the pool published until stop()."""
        if self._threads:
            return
        self._stop.clear()
        for target, name in (
            (self._reconcile_loop, "slices-reconcile"),
            (self._watch_loop, "slices-watch"),
            (self._health_loop, "slices-health"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loops; the slices stay (the kubelet removes them once the plugin is gone)."""
        self._stop.set()
        self._dirty.set()
        for thread in self._threads:
            # A reconcile may be mid-write; the watch may sit in a quiet HTTP stream (a daemon thread
            # that exits at its next event or timeout), so it gets only a moment.
            thread.join(timeout_s if thread.name == "slices-reconcile" else min(timeout_s, 1.0))
        self._threads = []

    def _reconcile_loop(self) -> None:
        backoff = 1.0
        first = True
        while not self._stop.is_set():
            if not first:
                # A waiting mode change is looked at again soon: its claims may be gone by then.
                wait_s = min(self.resync_s, self.pending_poll_s) if self.pending else self.resync_s
                if self._dirty.wait(wait_s) and not self._stop.is_set():
                    self._stop.wait(self.debounce_s)  # let a burst (a DeleteCollection) settle
                if self._stop.is_set():
                    return
            first = False
            self._dirty.clear()
            self._syncing_since = time.monotonic()
            try:
                self.sync()
                backoff = 1.0
            except Exception as exc:
                self.last_error = str(exc)
                log.error(
                    "publishing ResourceSlices failed; retrying",
                    extra={"node": self.node_name, "error": str(exc)},
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)
                self._dirty.set()
            finally:
                self._syncing_since = None

    def stuck(self, after_s: float = 300.0) -> str | None:
        """Why liveness should fail: a reconcile has not returned for `after_s` (a hung API call); None
        otherwise. A reconcile that fails returns, is logged and retried: that is not stuck."""
        since = self._syncing_since
        if since is None or time.monotonic() - since <= after_s:
            return None
        return f"publishing the ResourceSlices has not returned for {time.monotonic() - since:.0f} s"

    def _is_foreign(self, event: WatchEvent) -> bool:
        kind = event.get("type")
        obj = event.get("object") or {}
        name = objects.name(obj)
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return False
        with self._seen_lock:
            if kind == "DELETED":
                if name in self._own_deletes:
                    self._own_deletes.discard(name)
                    return False
                return True
            return self._own_versions.get(name) != objects.resource_version(obj)

    def _watch_loop(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                items, version = self.api.list(KIND, field_selector=self.field_selector)
                listed = {objects.name(s): objects.resource_version(s) for s in items}
                with self._seen_lock:
                    if listed != self._own_versions:
                        self._dirty.set()
                for event in self.api.watch(
                    KIND,
                    field_selector=self.field_selector,
                    resource_version=version,
                    timeout_s=self.watch_timeout_s,
                    stop=self._stop,
                ):
                    if self._is_foreign(event):
                        log.debug(
                            "slice changed by someone else; republishing",
                            extra={"node": self.node_name, "event": event.get("type")},
                        )
                        self._dirty.set()
                backoff = 0.5
            except Gone:
                continue
            except Exception as exc:
                log.warning(
                    "watching ResourceSlices failed; retrying",
                    extra={"node": self.node_name, "error": str(exc)},
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _health_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.inventory.wait_health_event(self.health_poll_s) and not self._stop.is_set():
                    self.inventory.refresh_health()
                    self._dirty.set()
                elif self._health_of(self.inventory.gpus()) != self._published_health:
                    self._dirty.set()  # someone else consumed the event (refresh_health) before us
            except Exception as exc:
                log.warning("reading GPU health failed", extra={"node": self.node_name, "error": str(exc)})
                self._stop.wait(5.0)


def _held(
    live: LiveClaims | str, name: str, record: tuple[bool, GpuSharingMode] | None
) -> tuple[bool, GpuSharingMode, tuple[str, ...]] | None:
    """(shareable, mode, claims) the device must keep for its live claims; None when nothing holds it.

    Without a published record (the kubelet wiped the pool), the claims say it: the scheduler gives
    a share ID to every allocation of a device published as shareable, and to no other.
    """
    if isinstance(live, str):
        return (*record, (live,)) if record is not None else None
    holders = live.get(name) or {}
    if not holders:
        return None
    if record is None:
        shared = any(holders.values())
        record = (shared, GpuSharingMode.SHARED if shared else GpuSharingMode.EXCLUSIVE)
    return (*record, tuple(sorted(holders)))


def _published_shareability(slices: list[Obj]) -> dict[str, tuple[bool, GpuSharingMode]]:
    """Device name -> (allowMultipleAllocations, mode) as the pool is published now."""
    published: dict[str, tuple[bool, GpuSharingMode]] = {}
    for item in slices:
        for device in objects.slice_devices(item):
            shared = bool(device.get("allowMultipleAllocations"))
            text = (objects.device_attribute(device, SHARING_ATTRIBUTE)).get("string")
            try:
                mode = GpuSharingMode(str(text))
            except ValueError:
                mode = GpuSharingMode.SHARED if shared else GpuSharingMode.EXCLUSIVE
            if (mode in SHAREABLE_MODES) != shared:  # an attribute that disagrees: trust the flag
                mode = GpuSharingMode.SHARED if shared else GpuSharingMode.EXCLUSIVE
            published[str(device.get("name", ""))] = (shared, mode)
    return published
