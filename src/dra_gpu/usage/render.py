"""`Usage` as a table for people and as JSON for scripts.

The JSON keys are a contract: scripts read them, so add keys rather than rename them. Quantities are
Kubernetes quantity strings (`"31Gi"`, `"91"`), exactly comparable with what the API server shows.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

from dra_gpu.quantity import format_quantity
from dra_gpu.text import gib, share_text
from dra_gpu.text import render_table as _table
from dra_gpu.usage.collect import Compute, Gpu, Holder, Pending, PendingRequest, Usage
from dra_gpu.usage.live import ClaimUse, LiveUsage

INDENT = "    "
MPS_ISOLATION = (
    "the MPS claims on this GPU share its daemon's writable /dev/shm and control socket: each can read and "
    "write the others' POSIX shared memory and stop their MPS server (docs/mps.md); share an MPS GPU only "
    "among tenants that trust each other"
)
"""What an MPS claim shares with the other MPS claims of its GPU, said wherever such claims are shown."""


def isolation(gpu: Gpu) -> str | None:
    """What the GPU's claims share with one another beyond the GPU itself; None: nothing tenant-writable."""
    mps = sum(1 for h in gpu.holders if h.strategy == "MPS")
    return f"{mps} claim{'s' if mps != 1 else ''}: {MPS_ISOLATION}" if mps else None


def _order(names: Any) -> list[str]:
    return sorted(names, key=lambda k: (k != "memory", k))


def _amount_text(name: str, amount: Fraction) -> str:
    return gib(amount) if name == "memory" else format_quantity(amount)


def usage_text(gpu: Gpu) -> str:
    """`memory 26 GiB of 80 GiB, cores 80 of 100 used`, or `free` for a GPU nobody holds."""
    if not gpu.holders:
        return "free"
    used = gpu.used()
    if not gpu.capacity:
        return ", ".join(f"{n} {_amount_text(n, used[n])}" for n in _order(used)) + " used"
    parts = [
        f"{n} {_amount_text(n, used[n])} of {_amount_text(n, gpu.capacity[n])}" for n in _order(gpu.capacity)
    ]
    return ", ".join(parts) + " used"


def _gpu_head(gpu: Gpu) -> str:
    parts = [gpu.device, gpu.uuid or "-"]
    parts.append(f"sharing {gpu.sharing or 'unknown'}")
    parts.append(usage_text(gpu))
    if any(h.whole for h in gpu.holders):
        parts.append("whole GPU taken")
    if gpu.overcommitted:
        parts.append("OVERCOMMITTED")
    if not gpu.healthy:
        parts.append("UNHEALTHY")
    if not gpu.published:
        parts.append("NOT PUBLISHED (no current ResourceSlice has this device)")
    return "  ".join(parts)


def _holder_row(holder: Holder) -> tuple[str, ...]:
    return (
        holder.claim,
        holder.request,
        share_text(holder.consumed),
        ", ".join(holder.pods) or "-",
        holder.allocated_by,
        holder.strategy_text,
    )


def _asks(request: PendingRequest) -> str:
    share = share_text(request.capacity)
    if request.allocation_mode == "All":
        return f"all matching GPUs ({share})"
    return share if request.count == 1 else f"{request.count} x {share}"


def use_text(use: ClaimUse | None, compute: Compute | None = None) -> str:
    """`1.0 GiB in use, 3 refused, 1 violation, compute floor 30% ...`: the agent's figures beside the
    claim's compute terms (`compute_text`); `-` where there is nothing to say."""
    parts = []
    if use is not None:
        if use.memory_used is not None:
            parts.append(f"{gib(Fraction(int(use.memory_used)))} in use")
        if use.refused:
            parts.append(f"{int(use.refused)} refused")
        if use.violations:
            parts.append(f"{int(use.violations)} violation{'s' if use.violations != 1 else ''}")
    if compute is not None:
        parts.append(compute_text(compute, use))
    return ", ".join(parts) or "-"


def compute_text(compute: Compute, use: ClaimUse | None) -> str:
    """`compute floor 30% ceiling 100% latency: 12.5 s used, 0.0 s borrowed, 2.0 s lent`, for a claim on its
    GPU's arbitration board: floor, ceiling and priority from the claim's config, used and borrowed what the
    claim reports and lent what the others borrowed of its idle floor, from its agent (a counter the agent
    has no series of has not counted yet: 0 s). Where the agent has no figures of the claim, the terms alone."""
    text = f"compute floor {compute.floor}% ceiling {compute.ceiling}% {compute.priority}"
    if use is not None:
        used, borrowed, lent = (
            value or 0.0
            for value in (use.compute_used_seconds, use.compute_borrowed_seconds, use.compute_lent_seconds)
        )
        text += f": {used:.1f} s used, {borrowed:.1f} s borrowed, {lent:.1f} s lent"
    return text


def _gpu_block(gpu: Gpu, live: LiveUsage | None = None) -> str:
    lines = [INDENT[:2] + _gpu_head(gpu)]
    lines += [f"{INDENT}taint {taint}" for taint in gpu.taints]
    shared = isolation(gpu)
    if shared:
        lines.append(f"{INDENT}isolation: {shared}")
    if gpu.holders:
        headers: tuple[str, ...] = ("CLAIM", "REQUEST", "SHARE", "PODS", "ALLOCATED BY", "STRATEGY")
        rows = [_holder_row(h) for h in gpu.holders]
        if live is not None:
            headers += ("USE",)
            rows = [
                (*row, use_text(live.get(h.namespace, h.name, gpu.uuid or ""), h.compute))
                for row, h in zip(rows, gpu.holders, strict=True)
            ]
        lines.append(_table(headers, rows, indent=INDENT))
    return "\n".join(lines)


def render_table(usage: Usage, live: LiveUsage | None = None) -> str:
    """`live`: the agents' figures, shown in a USE column (omitted when no agent could be read)."""
    live = live if live is not None and live.reached else None
    blocks = []
    for node in usage.nodes:
        count = len(node.gpus)
        blocks.append(
            f"node {node.name} ({count} GPU{'s' if count != 1 else ''})\n"
            + "\n".join(_gpu_block(g, live) for g in node.gpus)
        )
    if not usage.nodes:
        where = f" on node {usage.node_filter}" if usage.node_filter else ""
        blocks.append(f"no GPUs of {usage.driver}{where}")
    if usage.node_filter is None:
        if usage.pending:
            rows = [
                (p.claim, r.request, r.device_class, _asks(r), p.allocator)
                for p in usage.pending
                for r in p.requests
            ]
            headers = ("CLAIM", "REQUEST", "CLASS", "ASKS FOR", "WAITS FOR")
            blocks.append("pending claims (not allocated yet)\n" + _table(headers, rows, indent=INDENT[:2]))
        else:
            blocks.append("pending claims: none")
    return "\n\n".join(blocks)


def _quantities(values: dict[str, Fraction]) -> dict[str, str]:
    return {name: format_quantity(values[name]) for name in sorted(values)}


def _holder_json(holder: Holder) -> dict[str, Any]:
    return {
        "namespace": holder.namespace,
        "name": holder.name,
        "request": holder.request,
        "wholeGpu": holder.whole,
        "consumed": dict(sorted(holder.consumed.items())),
        "shareID": holder.share_id,
        "strategy": holder.strategy,
        "configError": holder.config_error,
        "pods": holder.pods,
        "allocatedBy": holder.allocated_by,
        "compute": _compute_json(holder.compute),
    }


def _compute_json(compute: Compute | None) -> dict[str, Any] | None:
    """Percent of the GPU; null for a share not on its GPU's arbitration board."""
    if compute is None:
        return None
    return {"floor": compute.floor, "ceiling": compute.ceiling, "priority": compute.priority}


def _gpu_json(gpu: Gpu) -> dict[str, Any]:
    return {
        "device": gpu.device,
        "pool": gpu.pool,
        "uuid": gpu.uuid,
        "index": gpu.index,
        "sharing": gpu.sharing,
        "shareable": gpu.shareable,
        "published": gpu.published,
        "healthy": gpu.healthy,
        "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in gpu.taints],
        "capacity": _quantities(gpu.capacity),
        "used": _quantities(gpu.used()),
        "free": _quantities(gpu.free()),
        "overcommitted": gpu.overcommitted,
        "claims": [_holder_json(h) for h in gpu.holders],
        "isolation": isolation(gpu),
    }


def _pending_json(pending: Pending) -> dict[str, Any]:
    return {
        "namespace": pending.namespace,
        "name": pending.name,
        "waitsFor": pending.allocator,
        "requests": [
            {
                "request": r.request,
                "deviceClassName": r.device_class,
                "allocationMode": r.allocation_mode,
                "count": r.count,
                "capacity": dict(sorted(r.capacity.items())),
            }
            for r in pending.requests
        ],
    }


def _use_json(use: ClaimUse | None, compute: Compute | None) -> dict[str, Any] | None:
    """The agent's figures; `computeFloor`, `computeCeiling` (ratios of the GPU) and `computePriority` are the
    claim's own (`compute`), kept here for the scripts that read them here."""
    if use is None:
        return None
    on_board = compute is not None
    return {
        "memoryUsedBytes": use.memory_used,
        "memoryLimitBytes": use.memory_limit,
        "computeBusySeconds": use.busy_seconds,
        "throttledSeconds": use.throttled_seconds,
        "allocationsRefused": use.refused,
        "watchdogViolations": use.violations,
        "computeFloor": compute.floor / 100 if compute is not None else None,
        "computeCeiling": compute.ceiling / 100 if compute is not None else None,
        "computePriority": compute.priority if compute is not None else None,
        "computeUsedSeconds": use.compute_used_seconds or (0.0 if on_board else None),
        "computeBorrowedSeconds": use.compute_borrowed_seconds or (0.0 if on_board else None),
        "computeLentSeconds": use.compute_lent_seconds or (0.0 if on_board else None),
    }


def to_json(usage: Usage, live: LiveUsage | None = None) -> dict[str, Any]:
    """With `live`, every claim entry gets `use` (null where its agent had no figure) and the document
    `agents` (which answered, which not)."""
    out: dict[str, Any] = {
        "driver": usage.driver,
        "nodeFilter": usage.node_filter,
        "nodes": [{"name": n.name, "gpus": [_gpu_json(g) for g in n.gpus]} for n in usage.nodes],
        "pending": [_pending_json(p) for p in usage.pending],
    }
    if live is not None:
        for node_json, node in zip(out["nodes"], usage.nodes, strict=True):
            for gpu_json, gpu in zip(node_json["gpus"], node.gpus, strict=True):
                for claim_json, h in zip(gpu_json["claims"], gpu.holders, strict=True):
                    claim_json["use"] = _use_json(live.get(h.namespace, h.name, gpu.uuid or ""), h.compute)
        out["agents"] = {"reached": live.reached, "unreachable": live.unreachable}
    return out


def render_json(usage: Usage, live: LiveUsage | None = None) -> str:
    return json.dumps(to_json(usage, live), indent=2)
