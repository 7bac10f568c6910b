"""The kubelet's DRA services, v1 and v1beta1, over one Preparer.

The two versions have the same messages except `Device.share_id`, which only v1 has (since 1.35).
A problem with one claim is that claim's `error`; the call itself only fails for what the kubelet
would treat as a transport problem anyway.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from dra_gpu.plugin.prepare import Preparer
from dra_gpu.plugin.sharing.plan import ClaimInfo
from dra_gpu.proto import dra_v1, dra_v1_grpc, dra_v1beta1, dra_v1beta1_grpc


class _DraCore:
    """`DRAPlugin` for the pb2 module of one API version."""

    def __init__(self, preparer: Preparer, pb: ModuleType, with_share_id: bool) -> None:
        self.preparer = preparer
        self.pb = pb
        self.with_share_id = with_share_id

    @staticmethod
    def _claims(request: Any) -> tuple[list[ClaimInfo], dict[str, str]]:
        valid: list[ClaimInfo] = []
        invalid: dict[str, str] = {}
        for c in request.claims:
            missing = [f for f in ("namespace", "name", "uid") if not getattr(c, f)]
            if missing:
                invalid[c.uid] = f"the kubelet sent a claim without {', '.join(missing)}"
            else:
                valid.append(ClaimInfo(uid=c.uid, namespace=c.namespace, name=c.name))
        return valid, invalid

    def prepare(self, request: Any) -> Any:
        claims, invalid = self._claims(request)
        response = self.pb.NodePrepareResourcesResponse()
        for uid, error in invalid.items():
            response.claims[uid].error = error
        if not claims:
            return response
        for uid, result in self.preparer.prepare(claims).items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for device in result.devices:
                out = entry.devices.add(
                    request_names=device.requestNames,
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=device.cdiDeviceIds,
                )
                if self.with_share_id and device.shareId:
                    out.share_id = device.shareId
        return response

    def unprepare(self, request: Any) -> Any:
        claims, invalid = self._claims(request)
        response = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in invalid.items():
            response.claims[uid].error = error
        if not claims:
            return response
        for uid, error in self.preparer.unprepare(claims).items():
            response.claims[uid].error = error
        return response


class DraV1Servicer(dra_v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self._core = _DraCore(preparer, dra_v1, with_share_id=True)

    def NodePrepareResources(
        self, request: dra_v1.NodePrepareResourcesRequest, context: Any
    ) -> dra_v1.NodePrepareResourcesResponse:
        return self._core.prepare(request)  # type: ignore[no-any-return]

    def NodeUnprepareResources(
        self, request: dra_v1.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        return self._core.unprepare(request)  # type: ignore[no-any-return]


class DraV1beta1Servicer(dra_v1beta1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self._core = _DraCore(preparer, dra_v1beta1, with_share_id=False)

    def NodePrepareResources(
        self, request: dra_v1beta1.NodePrepareResourcesRequest, context: Any
    ) -> dra_v1beta1.NodePrepareResourcesResponse:
        return self._core.prepare(request)  # type: ignore[no-any-return]

    def NodeUnprepareResources(
        self, request: dra_v1beta1.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_v1beta1.NodeUnprepareResourcesResponse:
        return self._core.unprepare(request)  # type: ignore[no-any-return]
