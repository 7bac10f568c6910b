"""The kubelet's DRA service, `v1.DRAPlugin`, over one Preparer.

Only v1: the driver publishes `resource.k8s.io/v1` slices, which need Kubernetes 1.34+, and every
1.34+ kubelet speaks v1 (v1beta1 is deprecated in the kubelet). A problem with one claim is that
claim's `error`; the call itself only fails for what the kubelet would treat as a transport problem.

What the kubelet sends is checked here, before anything else looks at it: a claim whose UID,
namespace or name could not have come from the API server gets an error and is never prepared,
unprepared or turned into a path (`identity`). The answer is kept under gRPC's default message
limit (the kubelet's client refuses a larger one, losing every claim of the call): claims' answers
that would take it over are replaced, largest first, by a short error saying so, and as a last
resort left out (the kubelet then calls again for them). A call stops starting claims when the
kubelet cancels it, and in time to answer before its deadline (`Preparer`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dra_gpu.plugin.calls import PrepareResult
from dra_gpu.plugin.errors import bounded
from dra_gpu.plugin.identity import claim_problem
from dra_gpu.plugin.preparer import Preparer
from dra_gpu.plugin.sharing.plan import ClaimInfo
from dra_gpu.proto import dra_v1, dra_v1_grpc

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 4 * 1024 * 1024 - 64 * 1024
"""gRPC's default limit on a received message is 4 MiB (the kubelet keeps it); a margin for framing."""
CUT_SHORT = (
    "this claim's answer was left out: the answer to the whole call would exceed gRPC's 4 MiB message "
    "limit (too many claims, or their errors too long); the kubelet's next call answers it"
)

Response = TypeVar("Response", dra_v1.NodePrepareResourcesResponse, dra_v1.NodeUnprepareResourcesResponse)


def _claims(
    request: dra_v1.NodePrepareResourcesRequest | dra_v1.NodeUnprepareResourcesRequest,
) -> tuple[list[ClaimInfo], dict[str, str]]:
    """The claims to act on, and an error for each UID that cannot be acted on (first one wins)."""
    valid: dict[str, ClaimInfo] = {}
    invalid: dict[str, str] = {}
    for c in request.claims:
        if c.uid in invalid:
            continue
        problem = claim_problem(c.uid, c.namespace, c.name)
        known = valid.get(c.uid)
        if problem is None and known is not None and (known.namespace, known.name) != (c.namespace, c.name):
            problem = f"the kubelet sent the claim UID {c.uid} twice, for different claims"
            del valid[c.uid]
        if problem is not None:
            invalid[c.uid] = problem
        elif known is None:
            valid[c.uid] = ClaimInfo(uid=c.uid, namespace=c.namespace, name=c.name)
    return list(valid.values()), invalid


def _deadline(context: Any) -> float | None:
    """The call's deadline on the time.monotonic clock; None without one."""
    remaining = getattr(context, "time_remaining", lambda: None)()
    return None if remaining is None else time.monotonic() + remaining


def _cancelled(context: Any) -> Callable[[], bool]:
    """Whether the kubelet cancelled the call (or left): gRPC's context is no longer active."""
    is_active = getattr(context, "is_active", None)
    return (lambda: False) if is_active is None else (lambda: not is_active())


def _answer(
    response: Response,
    order: Sequence[str],
    fill: Callable[[Any, str], None],
) -> Response:
    """Fill `response.claims` in `order` (UIDs), each by `fill(entry, uid)`, within MAX_RESPONSE_BYTES."""
    values: dict[str, int] = {}
    for uid in order:
        entry = response.claims[uid]
        try:
            fill(entry, uid)
        except Exception:  # one claim's answer never costs the others theirs
            log.exception("could not build a claim's answer", extra={"uid": uid[:64]})
            entry.Clear()
            entry.error = "internal error: the plugin could not build this claim's answer; see its log"
        values[uid] = entry.ByteSize()
    keys = {uid: len(uid.encode()) + 16 for uid in order}  # a map entry: key, tags and lengths
    total = sum(values.values()) + sum(keys.values())
    if total <= MAX_RESPONSE_BYTES:
        return response
    short = len(CUT_SHORT.encode()) + 3
    # The largest answers first become the short reason...
    for uid in sorted((u for u in order if values[u] > short), key=lambda u: -values[u]):
        if total <= MAX_RESPONSE_BYTES:
            break
        entry = response.claims[uid]
        entry.Clear()
        entry.error = CUT_SHORT
        total -= values[uid] - entry.ByteSize()
        values[uid] = entry.ByteSize()
    # ...and if that is not enough (UIDs alone too long), the claims with the longest UIDs are left out.
    left_out = 0
    position = {uid: i for i, uid in enumerate(order)}
    for uid in sorted(order, key=lambda u: (-keys[u], -position[u])):
        if total <= MAX_RESPONSE_BYTES:
            break
        total -= values[uid] + keys[uid]
        del response.claims[uid]
        left_out += 1
    log.warning(
        "the answer to a call was cut to fit gRPC's message limit",
        extra={"claims": len(order), "left_out": left_out, "limit_bytes": MAX_RESPONSE_BYTES},
    )
    return response


class DraV1Servicer(dra_v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(
        self, request: dra_v1.NodePrepareResourcesRequest, context: Any
    ) -> dra_v1.NodePrepareResourcesResponse:
        claims, invalid = _claims(request)
        results: dict[str, PrepareResult] = {
            uid: PrepareResult(error=error) for uid, error in invalid.items()
        }
        if claims:
            try:
                results.update(
                    self.preparer.prepare(claims, deadline=_deadline(context), cancelled=_cancelled(context))
                )
            except Exception:
                log.exception("prepare failed unexpectedly")
                failed = PrepareResult(error="internal error: the plugin failed this call; see its log")
                results.update({c.uid: failed for c in claims})

        def fill(entry: Any, uid: str) -> None:
            result = results[uid]
            if result.error:
                entry.error = bounded(result.error)
                return
            for device in result.devices:
                out = entry.devices.add(
                    request_names=device.requestNames,
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=device.cdiDeviceIds,
                )
                if device.shareId:
                    out.share_id = device.shareId

        order = list(dict.fromkeys(c.uid for c in request.claims))
        return _answer(dra_v1.NodePrepareResourcesResponse(), order, fill)

    def NodeUnprepareResources(
        self, request: dra_v1.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        claims, invalid = _claims(request)
        errors: dict[str, str] = dict(invalid)
        if claims:
            try:
                errors.update(
                    self.preparer.unprepare(
                        claims, deadline=_deadline(context), cancelled=_cancelled(context)
                    )
                )
            except Exception:
                log.exception("unprepare failed unexpectedly")
                errors.update(
                    {c.uid: "internal error: the plugin failed this call; see its log" for c in claims}
                )

        def fill(entry: Any, uid: str) -> None:
            if errors.get(uid):
                entry.error = bounded(errors[uid])

        order = list(dict.fromkeys(c.uid for c in request.claims))
        return _answer(dra_v1.NodeUnprepareResourcesResponse(), order, fill)
