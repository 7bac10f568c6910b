"""From the kubelet's (namespace, name, UID) to this node's shares of a ResourceClaim, or a clear error.

The kubelet sends only the claim's identity; what was allocated and how it is configured is read
from the API. Every way the claim can be unusable here has its own message, because that message is
what the user finds in the pod's events.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dra_gpu.config import ConfigError, merge_configs
from dra_gpu.inventory import GpuInfo
from dra_gpu.kube import ApiError, KubeAPI, NotFound
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing.plan import ClaimInfo, Share
from dra_gpu.quantity import QuantityError, parse_quantity


def fetch_claim(api: KubeAPI, claim: ClaimInfo) -> dict[str, Any]:
    try:
        obj = api.get("ResourceClaim", claim.name, claim.namespace)
    except NotFound:
        raise PrepareError(
            f"ResourceClaim {claim.ref} not found: it was deleted before the pod could start",
            reason="claim_not_found",
        ) from None
    except ApiError as exc:
        raise PrepareError(f"reading ResourceClaim {claim.ref}: {exc.message}", reason="api_error") from None
    except Exception as exc:  # transport failures surface as the HTTP library's own exception types
        raise PrepareError(
            f"reading ResourceClaim {claim.ref}: the API server could not be reached: {exc}",
            reason="api_error",
        ) from None
    actual = (obj.get("metadata") or {}).get("uid")
    if actual != claim.uid:
        raise PrepareError(
            f"ResourceClaim {claim.ref} has UID {actual}, but the kubelet asked for UID {claim.uid}: "
            f"the claim was deleted and re-created",
            reason="uid_mismatch",
        )
    return obj


def allocation_digest(obj: Mapping[str, Any], driver: str) -> str | None:
    """Which devices and configs of `driver` the claim is allocated, as a digest; None if none.

    An allocation is write-once, but a claim can be deallocated and allocated again under the same
    UID; a repeated prepare compares digests to notice that its recorded answer is for another
    allocation. Only the fields that decide what prepare does are covered, so that fields a newer
    API server adds to the same allocation never look like a new one.
    """
    devices = (((obj.get("status") or {}).get("allocation")) or {}).get("devices") or {}
    results = [
        [r.get("request"), r.get("pool"), r.get("device"), r.get("shareID")]
        for r in devices.get("results") or []
        if r.get("driver") == driver
    ]
    if not results:
        return None
    configs = [
        [c.get("source"), c.get("requests"), (c.get("opaque") or {}).get("parameters")]
        for c in devices.get("config") or []
        if (c.get("opaque") or {}).get("driver") == driver
    ]
    text = json.dumps({"results": results, "config": configs}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _consumed(raw: Mapping[str, Any] | None, where: str) -> dict[str, Fraction]:
    result: dict[str, Fraction] = {}
    for name, value in (raw or {}).items():
        try:
            result[name] = parse_quantity(value)
        except QuantityError as exc:
            raise PrepareError(
                f"{where}: consumedCapacity {name!r}: {exc}", reason="invalid_allocation"
            ) from None
    return result


def shares_of(
    obj: Mapping[str, Any], claim: ClaimInfo, driver: str, pool: str, gpus: Mapping[str, GpuInfo]
) -> list[Share]:
    """This driver's allocation results in the claim, each with its merged GpuConfig."""
    allocation = (obj.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError(
            f"ResourceClaim {claim.ref} is not allocated (status.allocation is empty)", reason="not_allocated"
        )
    devices = allocation.get("devices") or {}
    results = devices.get("results") or []
    ours = [r for r in results if r.get("driver") == driver]
    if not ours:
        others = sorted({str(r.get("driver")) for r in results})
        detail = f"its devices are from {', '.join(others)}" if others else "it has no allocated devices"
        raise PrepareError(
            f"ResourceClaim {claim.ref} has no device allocated by {driver} ({detail})", reason="other_driver"
        )
    configs = devices.get("config") or []
    shares: list[Share] = []
    for position, result in enumerate(ours):
        request, device = str(result.get("request", "")), str(result.get("device", ""))
        where = f"ResourceClaim {claim.ref}, request {request!r}, device {result.get('pool')}/{device}"
        if result.get("pool") != pool:
            raise PrepareError(
                f"{where}: the device is in pool {result.get('pool')!r}, not in this node's pool {pool!r}",
                reason="wrong_node",
            )
        gpu = gpus.get(device)
        if gpu is None:
            known = ", ".join(sorted(gpus)) or "none"
            raise PrepareError(
                f"{where}: this node has no such GPU (it has: {known})", reason="unknown_device"
            )
        try:
            config = merge_configs(configs, request, driver)
            from_class = [c for c in configs if c.get("source") == "FromClass"]
            class_config = merge_configs(from_class, request, driver) if from_class else None
        except ConfigError as exc:
            raise PrepareError(f"ResourceClaim {claim.ref}: {exc}", reason="invalid_config") from None
        shares.append(
            Share(
                position=position,
                request=request.split("/", 1)[0],
                pool=pool,
                device=device,
                gpu=gpu,
                share_id=result.get("shareID") or None,
                consumed=_consumed(result.get("consumedCapacity"), where),
                admin_access=bool(result.get("adminAccess")),
                config=config,
                class_config=class_config,
            )
        )
    return shares
