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

`Prepare` is the prepare path, one part of the preparer that `preparer.Preparer` wires together: the
others are `preparer_core.PreparerCore` (the checkpoint and the locks, which every part is given),
`calls.Calls` (serving the kubelet's calls claim by claim), `unprepare.Unprepare`, `sweeps.Sweeps` (the
background duties), `rebuild.Rebuild` (a lost checkpoint) and `made_devices.MadeDevices` (devices that
exist only while prepared, made by their device kind).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from dra_gpu.kube import builders, objects
from dra_gpu.plugin import sharing
from dra_gpu.plugin.checkpoint import (
    ClaimState,
    Hold,
    PreparedClaim,
    PreparedDevice,
)
from dra_gpu.plugin.claims import allocation_digest, fetch_claim, over_capacity, shares_of
from dra_gpu.plugin.errors import PrepareError, bounded, describe
from dra_gpu.plugin.locking import LockTimeout
from dra_gpu.plugin.made_devices import MadeDevices
from dra_gpu.plugin.preparer_core import PreparerCore
from dra_gpu.plugin.sharing.plan import ClaimInfo, Holder, Plan, Share
from dra_gpu.plugin.unprepare import Unprepare

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

NOTICE_REASON = "PreparedWithCaveat"
"""The event reason of what a prepared claim's user must know (a limit that holds per process only)."""

PREPARE_FAILED_REASON = "PrepareFailed"
NOT_REPORTED = frozenset({"claim_not_found", "api_error", "uid_mismatch", "identity_mismatch"})
"""Failures with no claim to report on, or none the user can fix in it."""


class Prepare:
    """Preparing a claim (see the module docstring): fresh, repeated, restored after a reboot or remade
    after its allocation or its made devices changed; and the notices its users must be told."""

    def __init__(self, core: PreparerCore, unprepare: Unprepare, made: MadeDevices) -> None:
        self.core = core
        self.unprepare = unprepare
        self.made = made
        self.backends = sharing.backends()
        self._notices: dict[str, tuple[dict[str, Any], list[str]]] = {}
        """Claim UID -> (claim, notices) of fresh prepares, posted as events once no lock is held."""
        self._notices_lock = threading.Lock()

    def post_notices(self, uids: Sequence[str]) -> None:
        """What users of freshly prepared claims must know, as Warning events on the claims."""
        with self._notices_lock:
            pending = [self._notices.pop(uid) for uid in uids if uid in self._notices]
        for obj, texts in pending:
            for text in texts:
                try:
                    self.core.events.record(obj, "Warning", NOTICE_REASON, text)
                except Exception as exc:  # the API unreachable: the prepare's log line stays
                    log.warning("could not post a claim's notice as an event", extra={"error": str(exc)})

    def forget_notices(self, uid: str) -> None:
        """Drop the claim's notices unposted (a rebuild re-adopting a claim told when it was first prepared)."""
        with self._notices_lock:
            self._notices.pop(uid, None)

    # -- prepare ---------------------------------------------------------------------------------------
    def prepare(self, claim: ClaimInfo, deadline: float | None = None) -> list[PreparedDevice]:
        """The kubelet's prepare of one claim (`calls.Work`)."""
        # The API read comes first, outside every lock: it can take as long as the API server's timeout.
        fetched: dict[str, Any] | None = None
        fetch_error: PrepareError | None = None
        try:
            fetched = fetch_claim(self.core.api, claim)
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
        targets = [builders.subject("ResourceClaim", claim.name, claim.namespace, claim.uid)]
        for consumer in objects.reserved_for(obj or {}):
            if consumer.get("resource") == "pods" and not consumer.get("apiGroup"):
                pod = builders.subject(
                    "Pod", str(consumer.get("name") or ""), claim.namespace, str(consumer.get("uid") or "")
                )
                targets.append(pod)
        for target in targets:
            try:
                self.core.events.record(target, "Warning", PREPARE_FAILED_REASON, bounded(exc.message))
            except Exception as error:  # an event is never worth failing or retrying the call for
                log.warning("could not record a prepare failure event", extra={"error": str(error)})

    def _prepare_locked(
        self,
        claim: ClaimInfo,
        fetched: dict[str, Any] | None,
        fetch_error: PrepareError | None,
        deadline: float | None = None,
    ) -> list[PreparedDevice]:
        with self.core.claim_locked(claim, fetched, deadline) as entry:
            obj: dict[str, Any] | None = None
            if entry is not None and entry.state == ClaimState.PREPARE_COMPLETED:
                obj = self._reallocated(entry, fetched)
                if obj is None:
                    if entry.bootId == self.core.boot_id and self.core.specs.exists(claim.uid):
                        return entry.devices
                    lost = self.made.lost(entry.uid)
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
                self.unprepare.undo(entry)
            if obj is None:
                if fetched is None:
                    assert fetch_error is not None
                    raise fetch_error
                obj = fetched
            return self.fresh(claim, obj)

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
            with self.core.lock.hold():
                self.core.specs.remove(entry.uid)  # it names the instance that is gone
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
        digest = allocation_digest(fetched, self.core.node.driver)
        return fetched if digest is not None and digest != entry.allocation else None

    def fresh(self, claim: ClaimInfo, obj: dict[str, Any]) -> list[PreparedDevice]:
        """Prepare an allocation; the caller holds the claim's and its GPUs' locks."""
        core = self.core
        shares = shares_of(obj, claim, core.node.driver, core.pool, core.gpus())
        for share in shares:
            if not share.gpu.healthy:
                raise PrepareError(
                    f"GPU {share.device} ({share.gpu.uuid}) is unhealthy: {share.gpu.health_reason}",
                    reason="unhealthy_device",
                )
        shares = self.made.materialize(claim, shares)
        try:
            plan = self._plan(claim, shares)
        except Exception:
            self.made.release(claim.uid)
            raise
        spec = plan.cdi_spec()
        entry = PreparedClaim(
            uid=claim.uid,
            namespace=claim.namespace,
            name=claim.name,
            state=ClaimState.PREPARE_STARTED,
            bootId=core.boot_id,
            devices=plan.answer(),
            shares=plan.share_records(),
            holds=plan.holds,
            cdiSpec=spec.to_dict(),
            allocation=allocation_digest(obj, core.node.driver),
        )
        core.put(entry)
        core.step("prepare:checkpoint-started")
        applied: list[Hold] = []
        try:
            for hold in entry.holds:
                core.handler(hold).apply(hold, core.node)
                applied.append(hold)
            core.step("prepare:setup-applied")
            with core.lock.hold():
                core.specs.write(claim.uid, spec)
            core.step("prepare:cdi-written")
        except Exception:
            self._rollback(entry, applied)
            raise
        core.put(entry.model_copy(update={"state": ClaimState.PREPARE_COMPLETED}))
        core.step("prepare:checkpoint-completed")
        for text in plan.notices:
            log.warning("prepared with a caveat", extra={"claim": claim.ref, "notice": text})
        if plan.notices:
            with self._notices_lock:
                self._notices[claim.uid] = (obj, list(plan.notices))
        return entry.devices

    def _others_on(self, claim: ClaimInfo, gpu_uuid: str) -> list[Holder]:
        """The shares other claims prepared on the GPU (not admin access), from the store's index."""
        with self.core.lock.hold():
            self.core.load()
            on_gpu = self.core.store.on_gpu(gpu_uuid)
        return [
            Holder(other.ref, record)
            for other in on_gpu
            if other.uid != claim.uid
            for record in other.shares
            if record.gpu == gpu_uuid and not record.adminAccess
        ]

    def _plan(self, claim: ClaimInfo, shares: list[Share]) -> Plan:
        node = self.core.node
        plan = Plan(claim=claim, shares=shares, driver=node.driver)
        for backend in self.backends:
            backend.contribute(plan, node)
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
            for backend in self.backends:
                problem = backend.conflict(share, others)
                if problem is not None:
                    raise PrepareError(f"ResourceClaim {claim.ref}: {problem}", reason="conflict")
            problem = over_capacity(share, records[share.position], others, node.driver)
            if problem is not None:
                raise PrepareError(f"ResourceClaim {claim.ref}: {problem}", reason="over_capacity")
        return plan

    def _restore(self, entry: PreparedClaim) -> list[PreparedDevice]:
        """A completed claim whose spec or GPU settings are gone (reboot, wiped tmpfs): set up again."""
        log.info("restoring a prepared claim after a reboot or a lost CDI spec", extra={"claim": entry.ref})
        core = self.core
        for hold in entry.holds:
            core.handler(hold).apply(hold, core.node)
        if entry.cdiSpec is None:
            raise PrepareError(f"the checkpoint has no CDI spec for claim {entry.ref}", reason="internal")
        with core.lock.hold():
            core.specs.write(entry.uid, entry.cdiSpec)
            current = core.load().claims.get(entry.uid)
            if current is not None:
                core.put(current.model_copy(update={"bootId": core.boot_id}))
        return entry.devices

    def _rollback(self, entry: PreparedClaim, applied: list[Hold]) -> None:
        """Undo what a failed prepare did. What cannot be undone keeps the claim's record, so that the
        kubelet's next call (prepare undoes it first, unprepare undoes it) or the sweep retries it."""
        try:
            core = self.core
            last = core.last_holders(entry)
            for hold in reversed(applied):
                core.handler(hold).release(hold, core.node, last[hold.key])
            self.made.release(entry.uid)
            with core.lock.hold():
                core.specs.remove(entry.uid)
                core.drop(entry.uid)
        except Exception as exc:
            self.core.metrics.errors.labels(operation="rollback", reason=_reason(exc)).inc()
            log.error(
                "rolling back a failed prepare left setup behind; its record stays for a later call to retry",
                extra={"claim": entry.ref, "error": bounded(describe(exc))},
            )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, PrepareError):
        return exc.reason
    if isinstance(exc, LockTimeout):
        return "lock_timeout"
    return "filesystem" if isinstance(exc, OSError) else "internal"
