"""An upgrade of the node agent from the previous release to this one and a rollback, under a running tenant:
the issue's table (pods restarted, time with no agent answering the kubelet, claims of every mode prepared by
one release and unprepared by the other, caps after), measured on simulated GPUs and the fake CUDA driver; then
the compute shares of the tenants launching kernels (the fake driver's busy time over a window): two claims
prepared by the old agent with their tenants under its library, before the change and after it, and beside them a
claim the new agent prepared (medians of the rounds; needs root, as the test does).

The scenario is tests/upgrade_harness.py's (the one tests/node_agent/test_upgrade.py asserts on); here it runs
`--rounds` times and the figures are printed. Needs a full clone (the previous release is built from the
repository's history) and the native limiter (make limiter).

    .venv/bin/python bench/upgrade.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from upgrade_harness import (  # noqa: E402
    COMPUTE,
    Release,
    Unavailable,
    Upgrade,
    containers_here,
    previous_release,
    this_release,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.rounds < 1:
        print("error: --rounds must be 1 or more", file=sys.stderr)
        return 2
    built = ROOT / "native" / "limiter" / "build"
    made = subprocess.run(["make", "-s", "-C", str(built.parent)], capture_output=True, text=True)
    if made.returncode != 0:
        print(f"error: make -C native/limiter failed:\n{made.stdout}{made.stderr}", file=sys.stderr)
        return 1
    try:
        previous = previous_release()
    except Unavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"{args.rounds} round(s) each; previous release {previous.source.parent.name if previous.source else '?'}"
    )
    for surge, strategy in (
        (False, "maxUnavailable: 1 (seamlessUpgrade: false)"),
        (True, "maxSurge: 1 (seamlessUpgrade)"),
    ):
        print(f"\n{strategy}")
        table(previous, built, args.rounds, surge)
    return 0


def table(previous: Release, built: Path, rounds: int, surge: bool) -> None:
    """The issue's table for one update strategy, worst of `rounds`."""
    rows: dict[str, list[tuple[int, float, int, str, str, int]]] = {"upgrade": [], "rollback": []}
    compute: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(rounds):
        upgrade = Upgrade(previous, this_release(built), built, surge=surge)
        try:
            figures = upgrade.run()
        finally:
            upgrade.close()
        for step in figures.steps:
            for moment, busy in step.compute.items():
                for name, share in busy.items():
                    compute.setdefault((step.name, moment, name), []).append(share)
                compute.setdefault((step.name, moment, "together"), []).append(sum(busy.values()))
            rows[step.name].append(
                (
                    step.tenants_before - step.tenants_after,
                    step.longest_gap_s,
                    len(step.unanswered),
                    f"{step.claims_prepared_before}/{step.claims_unprepared_after}",
                    "unchanged" if step.cap_after == step.cap_before and step.specs_unchanged else "CHANGED",
                    len(step.left_behind),
                )
            )
    print(
        "| direction | tenants restarted | longest time without an answer to the kubelet | calls unanswered "
        "| claims prepared before / unprepared after | caps after | left behind |"
    )
    print("|---|---|---|---|---|---|---|")
    for direction, results in rows.items():
        restarted = max(r[0] for r in results)
        gap_ms = max(r[1] for r in results) * 1000
        unanswered = sum(r[2] for r in results)
        counts = ", ".join(sorted({r[3] for r in results}))
        caps = ", ".join(sorted({r[4] for r in results}))
        left = sum(r[5] for r in results)
        print(
            f"| {direction} | {restarted} | {gap_ms:.0f} ms (asked every 5 ms) | {unanswered} | {counts} | {caps} "
            f"| {left} |"
        )
    shares_table(compute)


def shares_table(compute: dict[tuple[str, str, str], list[float]]) -> None:
    """Each launching tenant's busy share of its GPU, median of the rounds."""
    reason = containers_here()
    if reason is not None:
        print(f"\ncompute shares not measured: {reason}")
        return
    names = list(COMPUTE)
    terms = ", ".join(
        f"{n} {COMPUTE[n][0]} %" + (f" up to {COMPUTE[n][1]} %" if COMPUTE[n][1] != COMPUTE[n][0] else "")
        for n in names
    )
    print(f"\ncompute shares, % of the GPU (median of the rounds; {terms}):")
    print("| direction | moment | " + " | ".join(names) + " | together |")
    print("|---|---|" + "---|" * (len(names) + 1))
    for direction in ("upgrade", "rollback"):
        for moment in ("before", "after", "beside new"):
            cells = [
                f"{statistics.median(compute[key]):.1f}"
                if (key := (direction, moment, n)) in compute
                else "-"
                for n in [*names, "together"]
            ]
            print(f"| {direction} | {moment} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
