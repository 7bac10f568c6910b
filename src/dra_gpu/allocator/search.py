"""Finding devices for one claim, and saying why there are none.

Like the Kubernetes allocator this is a depth-first search over requests and their devices with
backtracking, taking the first complete solution; candidates are tried in slice/device order, or in
the placement policy's order. A claim's node-local devices all come from one node, so the search runs
per node (plus devices usable on every node). A claim with one single-device request and no
constraints, the common case, skips the search and takes the best device from the index's buckets.

Longer than 500 lines: the search and its explanation of a failure read the same tentative state (picks,
shares, counters), which one class keeps consistent; split, each half would reach into the other's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from dra_gpu.allocator.capacity import Amount, fmt
from dra_gpu.allocator.errors import AllocationError, Refusal, reason_of
from dra_gpu.allocator.index import DeviceIndex
from dra_gpu.allocator.policies import LabelRules, Score, score
from dra_gpu.allocator.pools import CounterKey, Device, Groups, SetKey
from dra_gpu.allocator.requests import MAX_RESULTS, Alt, Constraint, Request
from dra_gpu.config import PlacementPolicy

_BLOCKS_ALL = {Refusal.TAINTED, Refusal.COUNTERS, Refusal.IN_USE, Refusal.PLACEMENT}
"""Reasons that make an `All` request fail rather than skip the device."""

STEP_LIMIT = 200_000
"""Backtracking steps per claim before giving up (Kubernetes bounds its search with a timeout)."""


@dataclass(slots=True)
class Pick:
    alt: Alt
    index: int
    consumed: tuple[Amount, ...] | None  # what the share takes; None: the device is taken whole
    constraints_added: int


class Search:
    """One claim's search. Tentative picks live here; nothing is committed."""

    def __init__(
        self,
        index: DeviceIndex,
        requests: list[Request],
        constraints: list[Constraint],
        policy: PlacementPolicy | None,
        rules: LabelRules,
        node_filter: Callable[[str], bool] | None,
    ) -> None:
        self.index = index
        self.devices = index.devices
        self.usage = index.usage
        self.requests = requests
        self.constraints = constraints
        self.policy = policy
        self.rules = rules
        self.node_filter = node_filter
        self._node_ok: dict[str, bool] = {}
        self.extra: dict[int, tuple[Amount, ...]] = {}  # tentative shares per device
        self.taken: set[int] = set()  # tentatively taken whole
        self.picks: list[Pick] = []
        self.steps = 0
        self.scope: set[int] = set()
        self.refusals: set[Refusal] = set()
        self.counters_extra: dict[CounterKey, Amount] = {}  # tentatively taken shared counters
        self.groups_extra: Counter[tuple[SetKey, Groups]] = Counter()  # and their compatibility groups

    # --- per-device checks ------------------------------------------------------------------------

    def node_ok(self, d: Device) -> bool:
        if self.node_filter is None or d.node is None:
            return True
        ok = self._node_ok.get(d.node)
        if ok is None:
            ok = self._node_ok[d.node] = bool(self.node_filter(d.node))
        return ok

    def allowed(self, index: int) -> bool:
        """Node filter and placement label rules."""
        if not self.node_ok(self.devices[index]):
            return False
        return not self.rules.any or self.rules.blocks(self.usage, index) is None

    def fits_now(self, index: int, alt: Alt) -> tuple[Amount, ...] | None:
        """What the request takes from the device (`()` when taken whole) if it fits now, else None."""
        if alt.admin:  # other claims' allocations do not count; this claim takes a device once
            return () if index not in self.taken and index not in self.extra else None
        d = self.devices[index]
        cons = self.index.consumed(d, alt.cap)
        u = self.usage
        if isinstance(cons, str) or u.whole[index]:
            return None
        if (
            d.counters
            and self._newly_used(index)
            and u.counters_short(index, self.counters_extra, self.groups_extra)
        ):
            return None
        if not d.multi:
            return () if (not u.holders[index] and index not in self.taken) else None
        used = u.used[index]
        extra = self.extra.get(index)
        for n, spec in enumerate(d.specs):
            total = cons[n] + (used[n] if used is not None else 0) + (extra[n] if extra is not None else 0)
            if total > spec.value:
                return None
        return cons

    def _newly_used(self, index: int) -> bool:
        """Whether taking the device now would take its counters (they are taken once per device)."""
        return not self.usage.holders[index] and index not in self.taken and index not in self.extra

    def _take_counters(self, index: int, sign: int) -> None:
        for key, amount in self.devices[index].counters:
            self.counters_extra[key] = self.counters_extra.get(key, 0) + sign * amount
        for entry in self.devices[index].groups:
            self.groups_extra[entry] += sign

    def device_score(self, index: int, cons: tuple[Amount, ...] | None) -> tuple[Any, ...]:
        """Affinity first, then the policy, counting this search's tentative picks."""
        d = self.devices[index]
        used = self.usage.used[index]
        extra = self.extra.get(index)
        if extra is not None:
            used = tuple(a + b for a, b in zip(used or (0,) * len(extra), extra, strict=True))
        idle = not self.usage.holders[index] and index not in self.taken and extra is None
        consumed = cons if cons is not None and len(cons) == len(d.specs) else (0,) * len(d.specs)
        s = score(self.policy, d.multi, d.capacity_values, used, idle, consumed)
        return (0 if self.rules.prefers(self.usage, index) else 1, *s)

    # --- entry ------------------------------------------------------------------------------------

    def run(self) -> list[Pick] | None:
        """The picks of the first solution in preference order, or None."""
        if not self.requests:
            return []
        single = len(self.requests) == 1 and not self.constraints
        if single and all(a.mode == "ExactCount" and a.count == 1 for a in self.requests[0].alts):
            for alt in self.requests[0].alts:
                one = self.pick_one(alt)
                if one is not None:
                    cons = self.fits_now(one, alt)
                    assert cons is not None
                    shared = self.devices[one].multi and not alt.admin
                    return [Pick(alt, one, cons if shared else None, 0)]
            return None
        ranked = any(len(r.alts) > 1 for r in self.requests)
        best: tuple[tuple[int, ...], list[Pick]] | None = None
        for scope in self.scopes():
            self.scope = scope
            if not self.solve(0):
                continue
            if not ranked:
                return self.picks
            # Like the scheduler's scoring, prefer the node where earlier firstAvailable
            # alternatives fit; any node where every request gets its first choice wins at once.
            rank = tuple(
                next(r.alts.index(p.alt) for p in self.picks if p.alt.request == r.name)
                for r in self.requests
            )
            if best is None or rank < best[0]:
                best = (rank, list(self.picks))
            if not any(rank):
                break
            while self.picks:
                self.undo()
        return None if best is None else best[1]

    # --- one device, straight from the buckets ----------------------------------------------------

    def pick_one(self, alt: Alt) -> int | None:
        group, index, cap = alt.group, self.index, alt.cap
        if alt.admin:  # the buckets sort by what is in use, which admin access ignores
            return next((i for i in sorted(group.members) if self.allowed(i)), None)
        if self.rules.affinity is not None:
            near = [
                i
                for i in self.usage.label_devices.get(self.rules.affinity, ())
                if i in group.member_set and index.sig_fits(group.sig_of[i], cap) and self.allowed(i)
            ]
            if near:
                return min(near, key=lambda i: (index.sig_score(group.sig_of[i], cap, self.policy), i))
        fitting = [
            (index.sig_score(sig, cap, self.policy), bucket)
            for sig, bucket in group.buckets.items()
            if index.sig_fits(sig, cap)
        ]
        fitting.sort(key=lambda x: (x[0], x[1][0]))
        best: tuple[Score, int] | None = None
        for sc, bucket in fitting:
            if best is not None and sc > best[0]:
                break
            for i in bucket:
                if best is not None and (sc, i) >= best:
                    break
                if self.allowed(i):
                    best = (sc, i)
                    break
        return None if best is None else best[1]

    # --- backtracking search ----------------------------------------------------------------------

    def _fitting(self, members: Iterable[int], alt: Alt) -> list[int]:
        """Members of the alternative's group that fit it now (no tentative picks counted)."""
        g, index = alt.group, self.index
        return [
            i for i in members if i in g.member_set and (alt.admin or index.sig_fits(g.sig_of[i], alt.cap))
        ]

    def _enough(self, scope: set[int]) -> bool:
        """Whether each request, counted alone, may have enough devices that fit in `scope` (a
        multi-allocatable device can take several of them)."""

        def enough(alt: Alt) -> bool:
            fit = self._fitting(scope, alt)
            return len(fit) >= alt.min_devices or any(self.devices[i].multi for i in fit)

        return all(any(enough(a) for a in req.alts) for req in self.requests)

    def _all_scopes(self) -> list[tuple[str, set[int]]]:
        """(where, devices) sets one solution may draw from: each node's devices plus node-independent
        ones, then the node-independent ones alone.

        Nodes come in slice order without a policy; with one, by the best device for the first
        request, then (BinPack) fewer or (Spread) more devices that fit it.
        """
        by_node: dict[str, list[int]] = {}
        everywhere: list[int] = []
        selected: list[int] = []
        relevant: set[int] = set()
        for req in self.requests:
            for alt in req.alts:
                relevant |= alt.group.member_set
                if alt.mode == "All":  # these make "All" fail where they are, so place them too
                    relevant.update(i for i, _ in alt.group.tainted)
                    relevant.update(alt.group.counters)
        for i in sorted(relevant):
            if not self.allowed(i):
                continue
            d = self.devices[i]
            if d.node is not None:
                by_node.setdefault(d.node, []).append(i)
            elif d.node_selector:
                selected.append(i)
            else:
                everywhere.append(i)

        first = self.requests[0].alts[0]
        spread = self.policy == PlacementPolicy.SPREAD

        def node_key(node: str) -> tuple[Any, ...]:
            members = by_node[node]
            if self.policy is None and self.rules.affinity is None:
                return ((), 0, members[0])
            fit = self._fitting(members, first)
            if not fit:
                return ((9,), 0, members[0])
            sig_of = first.group.sig_of
            best = min(
                (0 if self.rules.prefers(self.usage, i) else 1, *self.index.sig_score(sig_of[i], first.cap, self.policy))
                for i in fit
            )  # fmt: skip
            return (best, -len(fit) if spread else len(fit), members[0])

        out = [
            (f"node {node}", set(by_node[node]).union(everywhere)) for node in sorted(by_node, key=node_key)
        ]
        if everywhere or selected:
            out.append(("devices usable on any node", set(everywhere).union(selected)))
        return out

    def scopes(self) -> Iterator[set[int]]:
        for _, scope in self._all_scopes():
            if self._enough(scope):
                yield scope

    def solve(self, r: int) -> bool:
        if r == len(self.requests):
            return True
        return any(self.pick(r, alt, 0, None, 0) for alt in self.requests[r].alts)

    def ordered(self, alt: Alt) -> list[int]:
        members = sorted(i for i in self.scope if i in alt.group.member_set)
        if self.policy is None and self.rules.affinity is None:
            return members
        keyed = sorted((self.device_score(i, self.fits_now(i, alt)), i) for i in members)
        return [i for _, i in keyed]

    def pick(self, r: int, alt: Alt, k: int, order: list[int] | None, start: int) -> bool:
        """Pick device k (and on) of request r's alternative `alt` from `order[start:]`."""
        self.steps += 1
        if self.steps > STEP_LIMIT:
            raise AllocationError(
                f"gave up after {STEP_LIMIT} search steps: the constraints are too hard to satisfy "
                "with the devices available"
            )
        if alt.mode == "ExactCount" and k == alt.count:
            return self.solve(r + 1)
        if order is None:
            order = self.ordered(alt)
            if alt.mode == "All":
                # As in Kubernetes: "all" is every matching device with room for the request, and
                # each of them must then be usable (not in use, taints tolerated), or it fails here.
                g = alt.group
                if any(i in self.scope for i, _ in g.tainted) or any(i in self.scope for i in g.counters):
                    return False
                order = [i for i in order if self._room(i, alt)]
                if not order:
                    return False
        if alt.mode == "All":
            if k == len(order):
                return self.solve(r + 1)
            if len(self.picks) >= MAX_RESULTS or not self.add(alt, order[k]):
                return False
            if self.pick(r, alt, k + 1, order, 0):
                return True
            self.undo()
            return False
        if len(self.picks) >= MAX_RESULTS:
            return False
        for pos in range(start, len(order)):
            if not self.add(alt, order[pos]):
                continue
            # As in Kubernetes, a multi-allocatable device may serve several of the request's devices
            # (one share each; a distinctAttribute constraint asks for different devices instead).
            # Starting the next pick at the same position keeps combinations, not permutations.
            after = pos if self.devices[order[pos]].multi else pos + 1
            if self.pick(r, alt, k + 1, order, after):
                return True
            self.undo()
        return False

    def _room(self, index: int, alt: Alt) -> bool:
        if alt.admin:
            return True
        d = self.devices[index]
        cons = self.index.consumed(d, alt.cap)
        if isinstance(cons, str):
            return False
        used = self.usage.used[index]
        if not d.multi or used is None:
            return True
        return all(u + c <= s.value for u, c, s in zip(used, cons, d.specs, strict=True))

    def add(self, alt: Alt, index: int) -> bool:
        cons = self.fits_now(index, alt)
        if cons is None:
            return False
        d = self.devices[index]
        takes_counters = bool(d.counters) and self._newly_used(index) and not alt.admin
        added = 0
        for c in self.constraints:
            if not c.add(alt, d):
                for done in reversed(self.constraints[:added]):
                    done.remove(alt)
                return False
            added += 1
        if takes_counters:
            self._take_counters(index, +1)
        if d.multi and not alt.admin:
            prev = self.extra.get(index)
            self.extra[index] = (
                cons if prev is None else tuple(a + b for a, b in zip(prev, cons, strict=True))
            )
            self.picks.append(Pick(alt, index, cons, added))
        else:
            self.taken.add(index)
            self.picks.append(Pick(alt, index, None, added))
        return True

    def undo(self) -> None:
        pick = self.picks.pop()
        for c in reversed(self.constraints[: pick.constraints_added]):
            c.remove(pick.alt)
        if pick.consumed is None:
            self.taken.discard(pick.index)
            if (
                self.devices[pick.index].counters
                and not self.usage.holders[pick.index]
                and not pick.alt.admin
            ):
                self._take_counters(pick.index, -1)
            return
        rest = tuple(a - b for a, b in zip(self.extra[pick.index], pick.consumed, strict=True))
        if any(p.index == pick.index for p in self.picks):
            self.extra[pick.index] = rest
        else:
            del self.extra[pick.index]
            if self.devices[pick.index].counters and not self.usage.holders[pick.index]:
                self._take_counters(pick.index, -1)

    # --- why not ----------------------------------------------------------------------------------

    def reason(self) -> str:
        """The metrics reason of the last `explain()`."""
        return reason_of(self.refusals)

    def explain(self) -> str:
        """Which request cannot be served and why, device by device category (first example shown).

        The categories met are left in `refusals`; `reason()` names the most telling one.
        """
        parts = []
        every_request_fits = True
        for req in self.requests:
            texts = []
            for alt in req.alts:
                text, ok = self._explain_alt(alt)
                if not ok:
                    texts.append(text)
            if len(texts) == len(req.alts):
                every_request_fits = False
                if len(req.alts) > 1:
                    parts.append(
                        f'request "{req.name}": no firstAvailable alternative fits: ' + "; ".join(texts)
                    )
                else:
                    parts.append(f'request "{req.name}": {texts[0]}')
        if every_request_fits:
            scopes = self._all_scopes()
            if not any(self._enough(scope) for _, scope in scopes):
                parts.append(
                    f"each request has devices that fit, but no node has enough for the whole claim "
                    f"(a claim's node-local devices must all be on one node; looked at {len(scopes)} "
                    f"node(s))"
                )
            elif self.constraints:
                shown = ", ".join(c.describe() for c in self.constraints)
                parts.append(
                    f"enough devices fit each request, but no set of them on one node satisfies {shown}"
                )
            else:
                parts.append(
                    "each request fits on its own, but not all together: its shares of one GPU "
                    "must fit that GPU together"
                )
        for problem in self.index.inventory.problems:
            self.refusals.add(Refusal.POOL_LEFT_OUT)
            parts.append(f"pool {problem.driver}/{problem.pool} is left out ({problem.why})")
        return "; ".join(parts)

    def _explain_alt(self, alt: Alt) -> tuple[str, bool]:
        """Why the alternative gets too few devices, and whether it gets enough after all."""
        g = alt.group
        reasons: dict[Refusal, list[str]] = {}
        for i, taint in g.tainted:
            reasons.setdefault(Refusal.TAINTED, []).append(f"{self.devices[i].label}: {taint}")
        for i in g.counters:
            reasons.setdefault(Refusal.COUNTERS, []).append(self.devices[i].label)
        fitting = 0
        shareable = False  # a fitting multi-allocatable device may take several of the devices
        for i in g.members:
            why = self._why_not(i, alt)
            if why is None:
                fitting += 1
                shareable = shareable or self.devices[i].multi
            else:
                category, detail = why
                label = self.devices[i].label
                reasons.setdefault(category, []).append(f"{label}: {detail}" if detail else label)
        who = f'"{alt.result_name}" ' if alt.sub else ""
        if alt.mode == "ExactCount":
            ok = fitting >= alt.count or shareable
            plural = "s" if alt.count > 1 else ""
            need = f"{who}needs {alt.count} device{plural}, {fitting} fit{'s' if fitting == 1 else ''}"
        else:
            unusable = sum(len(v) for k, v in reasons.items() if k in _BLOCKS_ALL)
            ok = 0 < fitting <= MAX_RESULTS and unusable == 0
            if fitting + unusable > MAX_RESULTS:
                need = f"{who}needs all {fitting + unusable} matching devices, more than one claim can get"
            elif unusable:
                verb = "is" if unusable == 1 else "are"
                need = f"{who}needs all {fitting + unusable} matching devices, {unusable} {verb} not usable"
            else:
                need = f"{who}needs all matching devices, none has room"
        matched = g.visible - g.class_mismatch
        text = f'{need}; of {g.visible} device(s), {matched} match class "{alt.class_name}"'
        if alt.selectors:
            text += f" and {matched - g.request_mismatch} of those the request's selectors"
        for category, items in reasons.items():
            self.refusals.add(category)
            example = items[0] if len(items) == 1 else f"e.g. {items[0]}"
            text += f"; {len(items)} {category.phrase} ({example})"
        return text, ok

    def _why_not(self, index: int, alt: Alt) -> tuple[Refusal, str] | None:
        d = self.devices[index]
        if not self.node_ok(d):
            return (Refusal.NODE_FILTER, str(d.node))
        cons = self.index.consumed(d, alt.cap)
        if isinstance(cons, str):
            return (Refusal.CAPACITY_REQUEST, cons)
        u = self.usage
        if u.whole[index] or (not d.multi and u.holders[index]):
            return (Refusal.IN_USE, "")
        short_counters = u.counters_short(index) if d.counters and not u.holders[index] else ""
        if short_counters:
            return (Refusal.COUNTERS, short_counters)
        used = u.used[index]
        if d.multi and used is not None:
            short = [
                f'capacity "{spec.name}": needs {fmt(cons[n])}, {fmt(spec.value - used[n])} of {fmt(spec.value)} left'
                for n, spec in enumerate(d.specs)
                if used[n] + cons[n] > spec.value
            ]
            if short:
                return (Refusal.NO_CAPACITY, ", ".join(short))
        block = self.rules.blocks(u, index) if self.rules.any else None
        if block is not None:
            return (Refusal.PLACEMENT, block)
        return None
