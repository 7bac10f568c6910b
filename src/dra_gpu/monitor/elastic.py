"""Elastic compute as the monitor shows it: each limiter claim's floor, ceiling and priority (the agent's
board) beside the GPU time it reports using, borrowing and lending (its activity file).

Used and borrowed are what the claim's own processes wrote: the figures are the claim's word, never
trusted for anyone's share, and bounded here so that one claim's numbers cannot run away with another's
(a claim's use in an interval is at most the interval, its borrowing at most its use). Lent is worked out
per GPU and sampling interval: the time borrowed on the GPU is charged to the claims that left part of
their floor idle, in proportion to what each left idle, and never more than that.

What a claim says of itself is checked against the driver (`contradicted.Contradictions`): a claim whose
activity file says it wants the GPU while the driver sees it run nothing is marked on its GPU's board
(`publish_marks`), a flag only the agent can write, and the library then counts none of its demand: it holds
no other claim back. The mark goes when the driver sees the claim run again (or its word stops saying busy).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from pathlib import Path

from dra_gpu.limiter_abi.board import (
    BOARD_FILE,
    Activity,
    BoardError,
    activity_name,
    mark_board,
    read_activity,
    read_board,
)

log = logging.getLogger(__name__)

NS = 1e9


def publish_marks(gpus_dir: Path, marked: Mapping[str, Set[str]]) -> None:
    """For each GPU (uuid -> the claim UIDs the driver contradicts there), mark exactly those claims on its
    board; a board already marked so is not written (the library reads a board again only when it changes)."""
    for gpu, uids in marked.items():
        try:
            if mark_board(gpus_dir / gpu / BOARD_FILE, uids):
                log.info("board marks changed", extra={"gpu": gpu, "contradicted": sorted(uids)})
        except OSError as exc:  # a board that cannot be written now: the next check tries again
            log.warning("cannot mark the board", extra={"gpu": gpu, "error": str(exc)})


@dataclass(frozen=True)
class ElasticFigures:
    floor: int
    ceiling: int
    priority: str
    used_seconds: float | None
    """None: the claim's activity file says nothing (missing, or damaged by the claim)."""
    borrowed_seconds: float | None
    held_seconds: float | None
    waiting: int | None
    lent_seconds: float


class ElasticLedger:
    """Reads the GPUs' boards and the claims' activity files at each sampling; keeps the lent totals."""

    def __init__(self, gpus_dir: Path) -> None:
        self._gpus_dir = gpus_dir
        self._last: dict[tuple[str, str], tuple[int, int]] = {}
        """(claim uid, gpu) -> (used_ns, borrowed_ns) at the previous sampling."""
        self._at: dict[str, float] = {}
        """gpu -> when it was last sampled (seconds, monotonic)."""
        self._lent: dict[tuple[str, str], float] = {}

    def sample(
        self, claims: Iterable[tuple[str, str]], now_s: float
    ) -> dict[tuple[str, str], ElasticFigures]:
        """Figures of those of `claims` ((uid, gpu)) that are on their GPU's board."""
        wanted: dict[str, set[str]] = {}
        for uid, gpu in claims:
            wanted.setdefault(gpu, set()).add(uid)
        out: dict[tuple[str, str], ElasticFigures] = {}
        for gpu, uids in wanted.items():
            directory = self._gpus_dir / gpu
            try:
                entries = [e for e in read_board(directory / BOARD_FILE) if e.claim_uid in uids]
            except (BoardError, OSError):
                continue
            reports = {e.claim_uid: read_activity(directory / activity_name(e.claim_uid)) for e in entries}
            interval = now_s - self._at[gpu] if gpu in self._at else None
            self._at[gpu] = now_s
            deltas = {uid: self._delta((uid, gpu), report, interval) for uid, report in reports.items()}
            if interval is not None and interval > 0:
                self._charge_lent(gpu, {e.claim_uid: e.floor for e in entries}, deltas, interval)
            for e in entries:
                report = reports[e.claim_uid]
                out[(e.claim_uid, gpu)] = ElasticFigures(
                    floor=e.floor,
                    ceiling=e.ceiling,
                    priority=e.priority,
                    used_seconds=None if report is None else report.used_ns / NS,
                    borrowed_seconds=None if report is None else report.borrowed_ns / NS,
                    held_seconds=None if report is None else report.held_ns / NS,
                    waiting=None if report is None else report.waiting,
                    lent_seconds=self._lent.get((e.claim_uid, gpu), 0.0),
                )
        self._last = {k: v for k, v in self._last.items() if k in out}
        self._lent = {k: v for k, v in self._lent.items() if k in out}
        self._at = {g: t for g, t in self._at.items() if g in wanted}
        return out

    def _delta(
        self, key: tuple[str, str], report: Activity | None, interval: float | None
    ) -> tuple[float, float]:
        """(used, borrowed) seconds since the last sampling, bounded: use within the interval, borrowing
        within the use. A counter that went back (the file was made anew) counts from zero."""
        if report is None:
            self._last.pop(key, None)
            return 0.0, 0.0
        before = self._last.get(key, (0, 0))
        self._last[key] = (report.used_ns, report.borrowed_ns)
        if interval is None:
            return 0.0, 0.0
        used = report.used_ns - before[0] if report.used_ns >= before[0] else report.used_ns
        borrowed = report.borrowed_ns - before[1] if report.borrowed_ns >= before[1] else report.borrowed_ns
        used_s = min(max(used, 0) / NS, max(interval, 0.0))
        return used_s, min(max(borrowed, 0) / NS, used_s)

    def _charge_lent(
        self, gpu: str, floors: dict[str, int], deltas: dict[str, tuple[float, float]], interval: float
    ) -> None:
        idle = {
            uid: max(0.0, floors[uid] / 100 * interval - (used - borrowed))
            for uid, (used, borrowed) in deltas.items()
        }
        idle_total = sum(idle.values())
        for uid in deltas:
            others_borrowed = sum(b for other, (_, b) in deltas.items() if other != uid)
            if idle[uid] <= 0 or others_borrowed <= 0 or idle_total <= 0:
                continue
            lent = min(idle[uid], others_borrowed * idle[uid] / idle_total)
            self._lent[(uid, gpu)] = self._lent.get((uid, gpu), 0.0) + lent
