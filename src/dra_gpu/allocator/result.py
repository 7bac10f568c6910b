"""A solution as `status.allocation` (`resource.k8s.io/v1` JSON), the way the scheduler writes it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dra_gpu.allocator.capacity import fmt
from dra_gpu.allocator.pools import Device
from dra_gpu.allocator.requests import Alt, Request
from dra_gpu.allocator.search import Pick
from dra_gpu.kube import builders, objects


def _node_selector(devices: list[Device]) -> dict[str, Any] | None:
    """One `metadata.name In [node]` term when any device is node-local (all are then on that node);
    else the merged terms of `nodeSelector` slices; None when usable everywhere."""
    for d in devices:
        if d.node is not None:
            return {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [d.node]}]}
                ]
            }
    merged: dict[str, list[Any]] = {"matchFields": [], "matchExpressions": []}
    for d in devices:
        terms = (d.node_selector or {}).get("nodeSelectorTerms") or []
        if terms:
            for kind, have in merged.items():
                have.extend(r for r in terms[0].get(kind) or [] if r not in have)
    term = {k: v for k, v in merged.items() if v}
    return {"nodeSelectorTerms": [term]} if term else None


def _configs(claim: Mapping[str, Any], requests: list[Request], picks: list[Pick]) -> list[dict[str, Any]]:
    """Class configs first, once per class and naming the requests that use it, then the claim's own
    configs that apply to a chosen request (empty `requests`: all)."""
    chosen: dict[str, Alt] = {}
    for pick in picks:
        chosen.setdefault(pick.alt.request, pick.alt)
    out: list[dict[str, Any]] = []
    by_class: dict[str, list[dict[str, Any]]] = {}
    for request in requests:
        alt = chosen.get(request.name)
        if alt is None:
            continue
        if alt.class_name in by_class:
            for entry in by_class[alt.class_name]:
                entry["requests"].append(alt.result_name)
            continue
        entries = []
        for cfg in objects.class_configs(alt.class_obj):
            entry = {k: v for k, v in cfg.items() if k != "requests"}
            entry.update(source="FromClass", requests=[alt.result_name])
            entries.append(entry)
        by_class[alt.class_name] = entries
        out.extend(entries)
    for cfg in objects.claim_configs(claim):
        listed = list(cfg.get("requests") or [])
        names = {n for a in chosen.values() for n in (a.request, a.result_name)}
        if not listed or any(n in names for n in listed):
            entry = {k: v for k, v in cfg.items() if k != "requests"}
            entry["source"] = "FromClaim"
            if listed:
                entry["requests"] = listed
            out.append(entry)
    return out


def build_allocation(
    claim: Mapping[str, Any],
    requests: list[Request],
    picks: list[Pick],
    devices: list[Device],
    now: Callable[[], str],
    new_uid: Callable[[], str],
) -> dict[str, Any]:
    results = []
    for pick in picks:
        d = devices[pick.index]
        shared = pick.consumed is not None
        entry = builders.device_result(
            pick.alt.result_name,
            d.driver,
            d.pool,
            d.name,
            share_id=new_uid() if shared else None,
            consumed={s.name: fmt(c) for s, c in zip(d.specs, pick.consumed or (), strict=True)}
            if shared
            else None,
            admin_access=pick.alt.admin,
        )
        if pick.alt.tolerations:
            entry["tolerations"] = [dict(t) for t in pick.alt.tolerations]
        if d.binding_conditions:
            entry["bindingConditions"] = list(d.binding_conditions)
        if d.binding_failure_conditions:
            entry["bindingFailureConditions"] = list(d.binding_failure_conditions)
        results.append(entry)
    allocation: dict[str, Any] = {"devices": {"results": results}}
    config = _configs(claim, requests, picks)
    if config:
        allocation["devices"]["config"] = config
    selector = _node_selector([devices[p.index] for p in picks])
    if selector is not None:
        allocation["nodeSelector"] = selector
    allocation["allocationTimestamp"] = now()
    return allocation
