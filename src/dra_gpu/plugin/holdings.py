"""The plugin's prepared claims as the usage monitor reads them (`dra_gpu.monitor.PreparedClaims`).

The node agent hands the monitor `prepared_holdings(...)`: the monitor then knows nothing of the
checkpoint's shape, and the limits each share recorded (`sharing/steps/usage_facts.py`) are read here, where
they are written. A share without recorded limits is held without a cap; several shares of one GPU in
one claim add up.
"""

from __future__ import annotations

from collections.abc import Callable

from dra_gpu.config import WatchdogPolicy
from dra_gpu.monitor.monitor import ClaimHoldings, Held, PreparedClaims
from dra_gpu.monitor.watchdog import ClaimRef
from dra_gpu.plugin.checkpoint import Checkpoint, CheckpointCorrupt, ClaimState, PreparedClaim
from dra_gpu.plugin.sharing.steps.usage_facts import CORES, MEMORY, WATCHDOG


def held_of(claim: PreparedClaim) -> ClaimHoldings:
    ref = ClaimRef(claim.uid, claim.namespace, claim.name)
    merged: dict[str, Held] = {}
    for share in claim.shares:
        if share.adminAccess:
            continue
        memory = int(share.detail[MEMORY]) if MEMORY in share.detail else None
        cores = int(share.detail[CORES]) if CORES in share.detail else None
        policy = WatchdogPolicy(share.detail[WATCHDOG]) if WATCHDOG in share.detail else None
        prev = merged.get(share.gpu)
        if prev is not None:
            memory = None if memory is None or prev.memory_limit is None else memory + prev.memory_limit
            cores = None if cores is None or prev.cores is None else min(cores + prev.cores, 100)
            if WatchdogPolicy.TERMINATE in (prev.policy, policy):
                policy = WatchdogPolicy.TERMINATE
            elif None in (prev.policy, policy):
                policy = None
        merged[share.gpu] = Held(ref, share.gpu, share.strategy, memory, cores, policy)
    return ClaimHoldings(ref, tuple(merged.values()))


def prepared_holdings(load: Callable[[], Checkpoint]) -> PreparedClaims:
    """The claims whose preparation completed, read from `load` (a store's `load`, or the preparer's
    `snapshot` in the agent, so that each record is held once in the process); none while the
    checkpoint is corrupt."""

    made: dict[str, tuple[PreparedClaim, ClaimHoldings]] = {}
    """uid -> the record last read and what it holds: a record is replaced, never changed, so a record read
    again is the same object and its holdings are not worked out again (the monitor asks at every watch)."""

    last_records: list[tuple[str, PreparedClaim]] = []
    last_out: list[ClaimHoldings] = []
    """The claims' records at the last call and the list made of them: the same records again (each the same
    object: a copy of the checkpoint shares them) give the same list, compared in one step."""

    def prepared() -> list[ClaimHoldings]:
        nonlocal last_records, last_out
        try:
            checkpoint = load()
        except CheckpointCorrupt:
            return []
        records = list(checkpoint.claims.items())
        if records == last_records:
            return last_out
        out = []
        for uid, claim in checkpoint.claims.items():
            if claim.state != ClaimState.PREPARE_COMPLETED:
                continue
            known = made.get(uid)
            if known is None or known[0] is not claim:
                known = made[uid] = (claim, held_of(claim))
            out.append(known[1])
        if len(made) > len(out):
            for uid in [
                u for u in made if u not in checkpoint.claims or made[u][0] is not checkpoint.claims[u]
            ]:
                del made[uid]
        last_records, last_out = records, out
        return out

    return prepared
