"""Unprepare: the spec removed first, then the holds released (a GPU-wide setting only with its last
holder in the checkpoint), then the record dropped; it never needs the API. Interrupted, it leaves a
completed record without a spec, which the kubelet's next call brings to the state it asks for.
"""

from __future__ import annotations

from dra_gpu.plugin.checkpoint import (
    PreparedClaim,
    PreparedDevice,
)
from dra_gpu.plugin.preparer_core import PreparerCore
from dra_gpu.plugin.sharing.plan import ClaimInfo


class Unprepare(PreparerCore):
    """Undoing a claim's record and what it holds (the kubelet's unprepare and the stale-claim sweep)."""

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
            # Under the same hold as the spec's removal: the claim's and GPUs' locks keep it true after.
            last = self._last_holders(entry)
        self._hook("unprepare:cdi-removed")
        for hold in reversed(entry.holds):
            self._handler(hold).release(hold, self.node, last[hold.key])
        self._mig.release(entry.uid, self.inventory.gpus())
        self._hook("unprepare:holds-released")
        self._drop(entry.uid)
        self._hook("unprepare:checkpoint-removed")
