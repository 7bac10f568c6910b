"""Unprepare: the spec removed first, then the holds released (a GPU-wide setting only with its last
holder in the checkpoint), then the record dropped; it never needs the API. Interrupted, it leaves a
completed record without a spec, which the kubelet's next call brings to the state it asks for.
"""

from __future__ import annotations

from dra_gpu.plugin.checkpoint import (
    PreparedClaim,
    PreparedDevice,
)
from dra_gpu.plugin.made_devices import MadeDevices
from dra_gpu.plugin.preparer_core import PreparerCore
from dra_gpu.plugin.sharing.plan import ClaimInfo


class Unprepare:
    """Undoing a claim's record and what it holds (the kubelet's unprepare, a repeated prepare and the
    stale-claim sweep)."""

    def __init__(self, core: PreparerCore, made: MadeDevices) -> None:
        self.core = core
        self.made = made

    def unprepare(self, claim: ClaimInfo, deadline: float | None = None) -> list[PreparedDevice]:
        """The kubelet's unprepare of one claim (`calls.Work`)."""
        core = self.core
        with core.claim_locked(claim, None, deadline) as entry:
            if entry is None:
                with core.lock.hold():
                    if claim.uid not in core.load().claims:
                        core.remove_leftovers(claim.uid)
                return []
            self.undo(entry)
            return []

    def undo(self, entry: PreparedClaim) -> None:
        """Undo a record; the caller holds the claim's and its GPUs' locks."""
        core = self.core
        # The spec goes first: while the record remains, a missing spec makes a repeated prepare
        # restore everything (see prepare.Prepare), so a crash anywhere below is safe without a third phase.
        with core.lock.hold():
            core.specs.remove(entry.uid)
            # Under the same hold as the spec's removal: the claim's and GPUs' locks keep it true after.
            last = core.last_holders(entry)
        core.step("unprepare:cdi-removed")
        for hold in reversed(entry.holds):
            core.handler(hold).release(hold, core.node, last[hold.key])
        self.made.release(entry.uid)
        core.step("unprepare:holds-released")
        core.drop(entry.uid)
        core.step("unprepare:checkpoint-removed")
