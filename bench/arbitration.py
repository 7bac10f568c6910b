"""Elastic compute, agent side: CPU for arbitration bookkeeping at 8 GPUs x 50 claims, as a % of one core.

The agent does no work per kernel launch: the library arbitrates in the claims' processes from the board
and the activity files. The agent's share is (1) a board rewrite, an activity file and its hard link on
each prepare, restore and unprepare of a limiter claim, and (2) reading each GPU's board and each claim's
activity file at every sampling of the monitor, and the elastic series at every scrape. This builds 8
GPUs x 50 limiter claims with the real hold handler (real files, in a temporary directory), has every
claim report use in its activity file, and times each part; it prints the CPU they take at the monitor's
default interval, a 15 s scrape interval and a (pessimistic) churn of one prepare and one unprepare per
second. Goal: under 2 % of a core.

    .venv/bin/python bench/arbitration.py [--gpus 8] [--claims-per-gpu 50] [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from dra_gpu.config import WatchdogPolicy
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.limiter_abi.board import GPUS_DIR
from dra_gpu.monitor import DEFAULT_INTERVAL_S
from dra_gpu.monitor.elastic import ElasticFigures, ElasticLedger
from dra_gpu.monitor.metrics import elastic_families
from dra_gpu.monitor.monitor import ClaimFigures, Held
from dra_gpu.monitor.watchdog import ClaimRef
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.sharing.modes.arbitration import ClaimArbitration, hold_key
from dra_gpu.plugin.sharing.plan import NodeContext

GOAL_PERCENT = 2.0
SCRAPE_INTERVAL_S = 15.0
SUPERVISE_INTERVAL_S = 5.0
"""The plugin's default: it checks every hold is in place (board entry, activity file and link)."""
CHURN_PER_S = 1.0
"""Prepares (and as many unprepares) per second: far more than a node sees."""
PRIORITIES = ("latency", "standard", "besteffort")


class _Elastic(Collector):
    def __init__(self, figures: list[ClaimFigures]) -> None:
        self.figures = figures

    def collect(self) -> list[Metric]:
        return list(elastic_families(self.figures))


def _holds(node: NodeContext, gpus: int, per_gpu: int) -> list[Hold]:
    holds = []
    for g in range(gpus):
        gpu = f"GPU-{g:08x}-0000-4000-8000-000000000000"
        for c in range(per_gpu):
            uid = f"{g:04x}{c:04x}-0000-4000-8000-000000000000"
            state = node.state_dir / "claims" / uid / "limiter"
            state.mkdir(parents=True)
            floor = 1 + (c % 20)
            params: dict[str, str | int] = {
                "gpu": gpu,
                "claim": uid,
                "floor": floor,
                "ceiling": 100,
                "priority": PRIORITIES[c % 3],
                "link": str(state / f"{gpu}.activity"),
            }
            holds.append(Hold(kind="arbitration", key=hold_key(gpu, uid), params=params))
    return holds


def _report(node: NodeContext, hold: Hold, round_: int) -> None:
    """What a claim's library writes: used and borrowed GPU time, growing each round. Bench only."""
    path = node.state_dir / GPUS_DIR / str(hold.params["gpu"]) / f"{hold.params['claim']}.activity"
    with open(path, "r+b") as f:
        f.seek(24)
        f.write(struct.pack("<QQ", round_ * 1_000_000_000, round_ * 400_000_000))


def _cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--claims-per-gpu", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dg-arbitration-") as tmp:
        root = Path(tmp)
        node = NodeContext(
            driver="gpu.dra-gpu.io",
            state_dir=root / "state",
            limiter_library=root / "lib.so",
            dev_root=root,
            commands=SimulatedCommands(state_file=root / "gpus.json"),
        )
        handler = ClaimArbitration()
        holds = _holds(node, args.gpus, args.claims_per_gpu)
        applies = [_cpu(partial(handler.apply, h, node)) for h in holds]

        ledger = ElasticLedger(node.state_dir / GPUS_DIR)
        keys = [(str(h.params["claim"]), str(h.params["gpu"])) for h in holds]
        samplings, scrapes = [], []
        figures: dict[tuple[str, str], ElasticFigures] = {}
        for r in range(args.rounds):
            for hold in holds:
                _report(node, hold, r)
            start = time.process_time()
            figures = ledger.sample(keys, now_s=r * DEFAULT_INTERVAL_S)
            samplings.append(time.process_time() - start)
            claims = [
                ClaimFigures(
                    Held(
                        ClaimRef(uid, "ns", f"claim-{uid}"),
                        gpu,
                        "Limiter",
                        None,
                        e.floor,
                        WatchdogPolicy.REPORT,
                    ),
                    elastic=e,
                )
                for (uid, gpu), e in figures.items()
            ]
            registry = CollectorRegistry()
            registry.register(_Elastic(claims))
            scrapes.append(_cpu(partial(generate_latest, registry)))
        page = generate_latest(registry)
        series = sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))
        assert len(figures) == len(holds), "every claim's board entry and activity file was read"
        lent = sum(e.lent_seconds for e in figures.values())

        supervise = _cpu(lambda: [handler.in_place(h, node) for h in holds])
        assert all(handler.in_place(h, node) for h in holds)

        releases = [_cpu(partial(handler.release, h, node, True)) for h in holds]
        for directory in (node.state_dir / GPUS_DIR).iterdir():  # kept for the GPU's next claim
            assert [p.name for p in directory.iterdir()] == ["board"], "every claim left its GPU's board"

    prepare, unprepare = statistics.median(applies), statistics.median(releases)
    sampling, scrape = statistics.median(samplings), statistics.median(scrapes)
    percent = 100 * (
        supervise / SUPERVISE_INTERVAL_S
        + sampling / DEFAULT_INTERVAL_S
        + scrape / SCRAPE_INTERVAL_S
        + CHURN_PER_S * (prepare + unprepare)
    )
    claims_total = len(holds)
    print(f"{args.gpus} GPUs x {args.claims_per_gpu} claims ({claims_total} limiter claims on boards)")
    print(f"prepare (activity file, link, board rewrite): {prepare * 1e6:.0f} us CPU median")
    print(f"unprepare (board rewrite, files removed):     {unprepare * 1e6:.0f} us CPU median")
    print(
        f"sampling (8 boards, {claims_total} activity files):    {sampling * 1e3:.1f} ms CPU median every {DEFAULT_INTERVAL_S:g} s"
    )
    print(
        f"scrape (elastic series):                      {scrape * 1e3:.1f} ms CPU median every {SCRAPE_INTERVAL_S:g} s"
    )
    print(f"elastic series on the page: {series} series, {len(page) / 1e3:.0f} kB")
    print(
        f"supervisor's check of {claims_total} holds: {supervise * 1e3:.1f} ms CPU every {SUPERVISE_INTERVAL_S:g} s"
    )
    print(f"lent time worked out over the run: {lent:.0f} s")
    print(
        f"agent CPU for arbitration bookkeeping: {percent:.2f} % of one core at {CHURN_PER_S:g} prepare+unprepare/s "
        f"(goal < {GOAL_PERCENT:g} %); no work per kernel launch"
    )
    return 0 if percent < GOAL_PERCENT else 1


if __name__ == "__main__":
    sys.exit(main())
