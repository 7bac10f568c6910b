"""Who held the GPU when, from the kernels of several claims on the GPU's global timer. Pure functions.

Kernels of different CUDA contexts do not run at once: the GPU time-slices between contexts, and a
kernel preempted by another context's keeps its span open (its spin counts the global timer, so it ends
only after it is resumed). Where spans of several claims overlap, the GPU was therefore running the one
that started last: `attribute` gives each instant to the latest-started span covering it, and so
never gives the GPU to two claims at once.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

from gpucheck.parse import Interval


def attribute(spans: Mapping[str, Sequence[Interval]], lo: int, hi: int, bin_ns: int) -> dict[str, list[int]]:
    """Nanoseconds each claim held the GPU in each bin of `bin_ns` from `lo` (the last bin ends at `hi`)."""
    n = max(0, math.ceil((hi - lo) / bin_ns))
    out = {claim: [0] * n for claim in spans}
    events = sorted(
        (s, e, claim) for claim, ss in spans.items() for s, e in ss if e > s and e > lo and s < hi
    )
    active: list[tuple[int, int, str]] = []  # (-start, end, claim): the latest start first
    i, t = 0, lo
    while i < len(events) or active:
        while active and active[0][1] <= t:
            heapq.heappop(active)
        if not active:
            if i == len(events):
                break
            t = max(t, events[i][0])
        while i < len(events) and events[i][0] <= t:
            s, e, claim = events[i]
            heapq.heappush(active, (-s, e, claim))
            i += 1
        while active and active[0][1] <= t:
            heapq.heappop(active)
        if not active:
            continue
        _, end, owner = active[0]
        nxt = min(end, events[i][0] if i < len(events) else end, hi)
        _add(out[owner], lo, t, nxt, bin_ns)
        t = nxt
        if t >= hi:
            break
    return out


def _add(bins: list[int], lo: int, s: int, e: int, bin_ns: int) -> None:
    while s < e:
        k = (s - lo) // bin_ns
        if k >= len(bins):
            return
        upto = min(e, lo + (k + 1) * bin_ns)
        bins[k] += upto - s
        s = upto


def window(spans: Mapping[str, Sequence[Interval]], trim_ns: int) -> tuple[int, int]:
    """The time every claim ran: from the last first start to the first last end, less `trim_ns` at each edge.
    (0, 0) when some claim has no span or nothing is left."""
    firsts, lasts = [], []
    for ss in spans.values():
        if not ss:
            return 0, 0
        firsts.append(min(s for s, _ in ss))
        lasts.append(max(e for _, e in ss))
    lo, hi = max(firsts) + trim_ns, min(lasts) - trim_ns
    return (lo, hi) if hi > lo else (0, 0)


def starts_after_gaps(spans: Sequence[Interval], gap_ns: int) -> list[int]:
    """The start of each burst: the first span, and every span that starts `gap_ns` or more after the
    end of all before it."""
    out: list[int] = []
    last_end: int | None = None
    for s, e in sorted(spans):
        if last_end is None or s - last_end >= gap_ns:
            out.append(s)
        last_end = e if last_end is None else max(last_end, e)
    return out


def reclaim_ns(
    borrower: Sequence[int],
    lo: int,
    bin_ns: int,
    wake: int,
    until: int,
    window_ns: int,
    bound_percent: float,
) -> int | None:
    """How long after `wake` the borrower is back at its share: the start of the first window of `window_ns`
    (from `wake` on, in steps of a bin) in which the borrower held at most `bound_percent` of the GPU.
    None when no such window ends by `until`. `borrower`: its nanoseconds per bin from `lo` (`attribute`)."""
    per = max(1, window_ns // bin_ns)
    first = max(0, (wake - lo) // bin_ns)
    last = min(len(borrower), (until - lo) // bin_ns)
    held = sum(borrower[first : first + per])
    for k in range(first, last - per + 1):
        if k > first:
            held += borrower[k + per - 1] - borrower[k - 1]
        if held <= bound_percent / 100 * per * bin_ns:
            return max(0, lo + k * bin_ns - wake)
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank: a value that occurred."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of nothing")
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]
