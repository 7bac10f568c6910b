"""The preparer, wired once: its parts built around one `PreparerCore` (`Preparer(core)`), and the calls the
server makes.

Each part is an object with its own state, given the parts it uses when it is built (`Preparer.__init__`,
in the only order that works: nothing calls a part built after it):

- `PreparerCore` (`preparer_core.py`): the checkpoint under the node lock, the claim and GPU locks, the
  handlers of node-side holds, the fault hook; every part is given it;
- `MadeDevices` (`made_devices.py`): devices made while prepared, by their device kind (dynamic MIG);
- `Unprepare` (`unprepare.py`): undoing a claim's record and what it holds;
- `Prepare` (`prepare.py`): the prepare path and the notices of fresh prepares;
- `Rebuild` (`rebuild.py`): completing a lost checkpoint;
- `Sweeps` (`sweeps.py`): the background duties;
- `Calls` (`calls.py`): serving the kubelet's calls claim by claim, deadlines, liveness.

The locking and crash-safety rules they all follow are in `prepare.py`'s docstring.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from dra_gpu.plugin.calls import Calls, PrepareResult
from dra_gpu.plugin.checkpoint import Checkpoint
from dra_gpu.plugin.errors import PrepareError, bounded, describe
from dra_gpu.plugin.made_devices import MadeDevices
from dra_gpu.plugin.prepare import Prepare
from dra_gpu.plugin.preparer_core import PreparerCore
from dra_gpu.plugin.rebuild import Rebuild
from dra_gpu.plugin.sharing.plan import ClaimInfo
from dra_gpu.plugin.sweeps import Sweeps
from dra_gpu.plugin.unprepare import Unprepare

log = logging.getLogger(__name__)


class Preparer:
    """Prepares and unprepares claims for the kubelet, and keeps the node's state true in the background."""

    def __init__(self, core: PreparerCore) -> None:
        self.core = core
        self.made = MadeDevices(core.node, core.inventory, core.lock, core.step, core.api)
        self.unprepare_part = Unprepare(core, self.made)
        self.prepare_part = Prepare(core, self.unprepare_part, self.made)
        self.rebuild = Rebuild(core, self.prepare_part)
        self.sweeps = Sweeps(core, self.unprepare_part, self.rebuild, self.made)
        self.calls = Calls(metrics=core.metrics, lock_timeout_s=core.lock.timeout_s, driver=core.node.driver)

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Load (or rebuild) the checkpoint once, before the kubelet can call."""
        core = self.core
        with core.lock.hold():
            checkpoint = core.load()
            rebuild = checkpoint.rebuildPending or (
                not core.store.exists() and bool(core.specs.uids_on_disk())
            )
            for path in [*core.store.temp_files(), *self.made.temp_files()]:
                # Written only under the node lock, which this holds: each is from an interrupted write.
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            if not rebuild:
                for uid in core.uids_on_disk() - set(checkpoint.claims):
                    # Specs and directories are created after their claim's record: these are from a lost write.
                    core.remove_leftovers(uid)
                try:
                    core.store.compact()
                except (PrepareError, OSError) as exc:  # a full disk: unprepares must still run, and free it
                    log.warning(
                        "could not fold the checkpoint's journal into its snapshot at start; serving with "
                        "the journal, folded later",
                        extra={"error": bounded(describe(exc))},
                    )
        if rebuild:
            log.warning("rebuilding the state from the claims in the API and the files on disk")
            self.rebuild.rebuild()
        checkpoint = core.snapshot()
        if not checkpoint.rebuildPending:  # else the claims in use are not known yet: keep their instances
            self.made.reconcile(set(checkpoint.claims))
        stale = [c.ref for c in checkpoint.claims.values() if c.bootId != core.boot_id]
        if stale:
            log.info(
                "the node rebooted since these claims were prepared; their CDI specs and GPU settings "
                "are restored when the kubelet prepares them again",
                extra={"claims": stale},
            )
        core.refresh_metrics(force=True)

    def close(self) -> None:
        """Fold the checkpoint's journal into its snapshot (at stop: the next start reads one file)."""
        try:
            with self.core.lock.hold():
                self.core.load()
                self.core.store.compact()
        except Exception as exc:  # the next start reads the journal too
            log.warning("could not write the checkpoint's snapshot at stop", extra={"error": describe(exc)})

    # -- the kubelet's calls ---------------------------------------------------------------------------
    def prepare(
        self,
        claims: Sequence[ClaimInfo],
        deadline: float | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, PrepareResult]:
        """Prepare each claim; `deadline` (time.monotonic) is the caller's: no claim starts that would
        end after it, nor once `cancelled()` (see `Calls.each`)."""
        started = time.perf_counter()
        self.rebuild.if_lost()
        results = self.calls.each("prepare", claims, self.prepare_part.prepare, deadline, cancelled)
        self.rebuild.if_lost()
        self.core.refresh_metrics()
        self.prepare_part.post_notices([claim.uid for claim in claims])
        self.core.metrics.prepare_seconds.observe(time.perf_counter() - started)
        return results

    def unprepare(
        self,
        claims: Sequence[ClaimInfo],
        deadline: float | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, str]:
        started = time.perf_counter()
        self.rebuild.if_lost()
        results = self.calls.each("unprepare", claims, self.unprepare_part.unprepare, deadline, cancelled)
        self.rebuild.if_lost()
        self.core.refresh_metrics()
        self.core.metrics.unprepare_seconds.observe(time.perf_counter() - started)
        return {uid: result.error for uid, result in results.items()}

    def busy(self) -> bool:
        """Whether the kubelet's calls are in progress."""
        return self.calls.busy()

    def stalled(self) -> str | None:
        """Why liveness should fail (`Calls.stalled`); None while calls make progress."""
        return self.calls.stalled()

    # -- background duties -----------------------------------------------------------------------------
    def supervise(self) -> None:
        """Re-apply node-side setup that vanished (`Sweeps.supervise`)."""
        self.sweeps.supervise()

    def collect_stale(self) -> None:
        """Undo the records of claims the API no longer has, remove unrecorded files (`Sweeps.collect_stale`)."""
        self.sweeps.collect_stale()

    def compact(self) -> None:
        """Fold the checkpoint's journal into its snapshot once it has outgrown it."""
        self.core.compact()

    def snapshot(self) -> Checkpoint:
        """The checkpoint as of now (`PreparerCore.snapshot`)."""
        return self.core.snapshot()
