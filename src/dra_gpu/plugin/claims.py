"""From the kubelet's (namespace, name, UID) to this node's shares of a ResourceClaim, or a clear error.

The kubelet sends only the claim's identity; what was allocated and how it is configured is read
from the API. Every way the claim can be unusable here has its own message, because that message is
what the user finds in the pod's events.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dra_gpu.config import ConfigError, GpuConfig, merge_configs
from dra_gpu.config.grants import effective
from dra_gpu.config.modes import takes_whole_gpu
from dra_gpu.inventory import GpuInfo
from dra_gpu.kube import ApiError, KubeAPI, NotFound, objects
from dra_gpu.plugin.checkpoint import ShareRecord
from dra_gpu.plugin.errors import PrepareError, quote, short
from dra_gpu.plugin.sharing.plan import ClaimInfo, Holder, Share
from dra_gpu.quantity import QuantityError, format_quantity, parse_quantity, to_int
from dra_gpu.vocabulary.device import CORES_CAPACITY, FULL_CORES, MEMORY_CAPACITY, published_memory


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
    actual = objects.uid(obj) or None
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
    allocated = objects.allocation(obj)
    results = [
        [r.request, r.pool, r.device, r.share_id]
        for r in objects.device_results(allocated)
        if r.driver == driver
    ]
    if not results:
        return None
    configs = [
        [c.get("source"), c.get("requests"), objects.opaque_parameters(c)[1]]
        for c in objects.allocation_config(allocated)
        if objects.opaque_parameters(c)[0] == driver
    ]
    text = json.dumps({"results": results, "config": configs}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def results_in_pool(obj: Mapping[str, Any], driver: str, pool: str) -> list[objects.DeviceResult]:
    """The claim's allocation results for `driver`'s devices in `pool` (this node's)."""
    return [
        r for r in objects.device_results(objects.allocation(obj)) if r.driver == driver and r.pool == pool
    ]


def _amount(record: ShareRecord, name: str) -> Fraction | int | None:
    text = record.consumed.get(name)
    return None if text is None else _parse_amount(text)


@functools.lru_cache(maxsize=4096)
def _parse_amount(text: str) -> Fraction | int | None:
    """A recorded amount (a few distinct values on a node: parsed once each, not per claim per call);
    whole numbers as int, which add up much faster."""
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return value.numerator if value.denominator == 1 else value


def _show_memory(value: Fraction | int) -> str:
    return format_quantity(value)


def _show_number(value: Fraction | int) -> str:
    return f"{float(value):g}"


def over_capacity(share: Share, record: ShareRecord, others: list[Holder], driver: str) -> str | None:
    """Why `share` would take its GPU past the GPU's capacity, with the shares already on it; or None.

    The scheduler never allocates that, so it means the allocation was written by something that
    does not count capacity, or the GPU is not the one the slice described. Only shares with consumed
    capacity count; whole-GPU allocations are the Exclusive backend's business.
    """
    if share.share_id is None:
        return None
    limits = {MEMORY_CAPACITY: published_memory(share.gpu.memory_bytes)[0], CORES_CAPACITY: FULL_CORES}
    for name, limit in limits.items():
        mine = _amount(record, name)
        if mine is None:
            continue
        used = sum(amount for o in others if (amount := _amount(o.record, name)) is not None)
        if used + mine <= limit:
            continue
        taken = [(o.claim, amount) for o in others if (amount := _amount(o.record, name)) is not None]
        show = _show_memory if name == MEMORY_CAPACITY else _show_number
        holders = ", ".join(f"{claim} {show(amount)}" for claim, amount in taken) or "none"
        return (
            f"GPU {share.device} ({share.gpu.uuid}) has {show(limit)} of {name}; the shares prepared on it "
            f"take {show(used)} ({holders}) and this one asks for {show(mine)}, more than the GPU has. The "
            f"allocation does not match the GPU (written by something that does not count capacity, or the "
            f"GPU changed since the slice was published): delete the claim so that it is allocated again"
        )
    return None


def _consumed(raw: Mapping[str, Any] | None, where: str) -> dict[str, Fraction]:
    result: dict[str, Fraction] = {}
    for name, value in (raw or {}).items():
        try:
            result[name] = parse_quantity(value)
        except QuantityError as exc:
            raise PrepareError(
                f"{where}: consumedCapacity {quote(name)}: {exc}", reason="invalid_allocation"
            ) from None
    return result


def granted(
    config: GpuConfig,
    class_config: GpuConfig | None,
    choice: objects.DeviceChoice | None,
    consumed: Mapping[str, Fraction],
    driver: str,
) -> GpuConfig:
    """The share's config within what its DeviceClass grants (`config.grants`), its floor and charge read
    as the scheduler charged them."""
    limiter = config.sharing.limiter
    if limiter is None:
        return config

    def amount(name: str) -> Fraction | None:
        value = consumed.get(name)
        return value if value is not None else consumed.get(f"{driver}/{name}")

    cores = amount(CORES_CAPACITY)
    floor = to_int(cores) if cores is not None else (limiter.cores or FULL_CORES)
    memory = amount(MEMORY_CAPACITY)
    named = choice is not None and any(n.rsplit("/", 1)[-1] == MEMORY_CAPACITY for n in choice.capacity)
    charged = to_int(memory) if memory is not None and named else None
    request = to_int(memory) if memory is not None else limiter.memory_bytes()
    name = choice.device_class if choice is not None and choice.device_class else "(unknown)"
    return effective(config, class_config, name, floor, charged, request)


def shares_of(
    obj: Mapping[str, Any], claim: ClaimInfo, driver: str, pool: str, gpus: Mapping[str, GpuInfo]
) -> list[Share]:
    """This driver's allocation results in the claim, each with its merged GpuConfig."""
    allocation = objects.allocation(obj)
    if allocation is None:
        raise PrepareError(
            f"ResourceClaim {claim.ref} is not allocated (status.allocation is empty)", reason="not_allocated"
        )
    results = objects.device_results(allocation)
    ours = [r for r in results if r.driver == driver]
    if not ours:
        others = sorted({r.driver for r in results})
        shown = ", ".join(short(d) for d in others[:5])
        shown += f" and {len(others) - 5} more" if len(others) > 5 else ""
        detail = f"its devices are from {shown}" if others else "it has no allocated devices"
        raise PrepareError(
            f"ResourceClaim {claim.ref} has no device allocated by {driver} ({detail})", reason="other_driver"
        )
    configs = objects.allocation_config(allocation)
    classes = {c.name: c for r in objects.device_requests(obj) for c in r.choices}
    shares: list[Share] = []
    for position, result in enumerate(ours):
        request, device = result.request, result.device
        where = f"ResourceClaim {claim.ref}, request {quote(request)}, device {short(result.pool)}/{short(device)}"
        if result.pool != pool:
            raise PrepareError(
                f"{where}: the device is in pool {quote(result.pool)}, not in this node's pool {pool!r}",
                reason="wrong_node",
            )
        gpu = gpus.get(device)
        if gpu is None:
            known = ", ".join(sorted(gpus)) or "none"
            raise PrepareError(
                f"{where}: this node has no such GPU (it has: {known})", reason="unknown_device"
            )
        consumed = _consumed(result.consumed, where)
        try:
            config = merge_configs(configs, request, driver)
            from_class = [c for c in configs if c.get("source") == "FromClass"]
            class_config = merge_configs(from_class, request, driver) if from_class else None
            config = granted(config, class_config, classes.get(request), consumed, driver)
        except ConfigError as exc:
            raise PrepareError(f"ResourceClaim {claim.ref}: {exc}", reason="invalid_config") from None
        if result.share_id is not None and takes_whole_gpu(config.sharing.strategy.value):
            raise PrepareError(
                f"{where}: the scheduler allocated a share of this GPU, and sharing.strategy "
                f"{config.sharing.strategy.value} (the default where the config leaves it out) takes a whole GPU: leave "
                f"the claim's sharing.strategy to its class, or use a class of whole GPUs",
                reason="invalid_config",
            )
        shares.append(
            Share(
                position=position,
                request=request.split("/", 1)[0],
                pool=pool,
                device=device,
                gpu=gpu,
                share_id=result.share_id,
                consumed=consumed,
                admin_access=result.admin_access,
                config=config,
                class_config=class_config,
            )
        )
    return shares
