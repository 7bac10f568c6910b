"""The kubelet's DRA service, `v1.DRAPlugin`, over one Preparer.

Only v1: the driver publishes `resource.k8s.io/v1` slices, which need Kubernetes 1.34+, and every
1.34+ kubelet speaks v1 (v1beta1 is deprecated in the kubelet). A problem with one claim is that
claim's `error`; the call itself only fails for what the kubelet would treat as a transport problem.
"""

from __future__ import annotations

from typing import Any

from dra_gpu.plugin.prepare import Preparer
from dra_gpu.plugin.sharing.plan import ClaimInfo
from dra_gpu.proto import dra_v1, dra_v1_grpc


class DraV1Servicer(dra_v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    @staticmethod
    def _claims(
        request: dra_v1.NodePrepareResourcesRequest | dra_v1.NodeUnprepareResourcesRequest,
    ) -> tuple[list[ClaimInfo], dict[str, str]]:
        valid: list[ClaimInfo] = []
        invalid: dict[str, str] = {}
        for c in request.claims:
            missing = [f for f in ("namespace", "name", "uid") if not getattr(c, f)]
            if missing:
                invalid[c.uid] = f"the kubelet sent a claim without {', '.join(missing)}"
            else:
                valid.append(ClaimInfo(uid=c.uid, namespace=c.namespace, name=c.name))
        return valid, invalid

    def NodePrepareResources(
        self, request: dra_v1.NodePrepareResourcesRequest, context: Any
    ) -> dra_v1.NodePrepareResourcesResponse:
        claims, invalid = self._claims(request)
        response = dra_v1.NodePrepareResourcesResponse()
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
                if device.shareId:
                    out.share_id = device.shareId
        return response

    def NodeUnprepareResources(
        self, request: dra_v1.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        claims, invalid = self._claims(request)
        response = dra_v1.NodeUnprepareResourcesResponse()
        for uid, error in invalid.items():
            response.claims[uid].error = error
        if not claims:
            return response
        for uid, error in self.preparer.unprepare(claims).items():
            response.claims[uid].error = error
        return response
