"""Slices that put a pool on a node it does not belong to: left out of allocation, with an Event, so one
node cannot shadow another's GPUs.

A pool counts only at its highest generation, so a slice of node A published in pool "node-b" at a higher
generation would hide node B's GPUs and put A's in their place. The ResourceSlice admission policy refuses
such a slice from the node agent; this is the controller's own check, for slices the policy did not see
(not installed, written by another account). A pool of this driver is named after its node, so a slice of
it that names another node is left out, and the node's own slices still count. For another driver's pool
whose slices, of any generation, name more than one node, no slice can be trusted to say where its devices
are: the whole pool is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.kube import objects

Obj = Mapping[str, Any]

REASON = "PoolNodeMismatch"


@dataclass(frozen=True)
class Refusal:
    """Slices left out of a pool, and why (the message of the Event on each of them)."""

    driver: str
    pool: str
    slices: tuple[Obj, ...]
    message: str


def _nodes(slice_obj: Obj) -> set[str]:
    """The nodes a slice places its devices on ("" for a slice of no single node)."""
    if objects.per_device_node_selection(slice_obj):
        return {str(d.get("nodeName") or "") for d in objects.slice_devices(slice_obj)} or {""}
    return {objects.slice_node(slice_obj)}


def _named(nodes: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in sorted(nodes))


def refuse_foreign_slices(slices: Iterable[Obj]) -> tuple[list[Obj], list[Refusal]]:
    """The slices to allocate from, and those left out by pool."""
    pools: dict[tuple[str, str], list[Obj]] = {}
    for s in slices:
        pools.setdefault((objects.slice_driver(s), objects.pool_name(s)), []).append(s)
    kept: list[Obj] = []
    refused: list[Refusal] = []
    for (driver, pool), members in pools.items():
        if driver == DRIVER_NAME:
            foreign = [m for m in members if _nodes(m) != {pool}]
            kept.extend(m for m in members if _nodes(m) == {pool})
            if foreign:
                nodes = set().union(*(_nodes(m) for m in foreign)) - {""}
                message = (
                    f"slice left out of pool {driver}/{pool}: a pool of {DRIVER_NAME} belongs to the node it is "
                    f"named after, and this slice names {_named(nodes) or 'no node'}; only the agent of node "
                    f"{pool!r} may publish it (delete the slice)"
                )
                refused.append(Refusal(driver, pool, tuple(foreign), message))
            continue
        nodes = set().union(*(_nodes(m) for m in members))
        if len(nodes) > 1 and nodes != {""}:
            message = (
                f"pool {driver}/{pool} is left out of allocation: its slices name the nodes "
                f"{_named(n for n in nodes if n)}, and one node could shadow another's devices with it"
            )
            refused.append(Refusal(driver, pool, tuple(members), message))
        else:
            kept.extend(members)
    return kept, refused
