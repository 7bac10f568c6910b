"""The one import point for the kubelet wire contracts (generated protobuf/gRPC modules).

Everything else in the driver imports from here, never from ``dra_gpu._proto``, so the layout of
the generated package can change without touching callers. The ``.proto`` sources live in
``api/kubelet``; regenerate with ``python tools/gen_protos.py``.
"""

from __future__ import annotations

from dra_gpu._proto.dra.v1 import api_pb2 as dra_v1
from dra_gpu._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from dra_gpu._proto.drahealth.v1 import api_pb2 as health_v1
from dra_gpu._proto.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from dra_gpu._proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from dra_gpu._proto.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from dra_gpu._proto.pluginregistration.v1 import api_pb2 as registration
from dra_gpu._proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc

__all__ = [
    "DRA_V1_SERVICE",
    "HEALTH_V1ALPHA1_SERVICE",
    "HEALTH_V1_SERVICE",
    "PLUGIN_TYPE",
    "dra_v1",
    "dra_v1_grpc",
    "full_service_name",
    "health_v1",
    "health_v1_grpc",
    "health_v1alpha1",
    "health_v1alpha1_grpc",
    "registration",
    "registration_grpc",
]

# Identifiers a plugin advertises in PluginInfo.supported_versions. They are NOT the gRPC service
# names (those come from the proto package line); the kubelet maps them to the services it calls.
# Only DRA v1: the driver publishes `resource.k8s.io/v1` slices, which need Kubernetes 1.34+, and every
# 1.34+ kubelet speaks `v1.DRAPlugin`. Health v1 is what a 1.37+ kubelet prefers; v1alpha1 serves older
# kubelets (the kubelet keeps it until 1.40).
DRA_V1_SERVICE = "v1.DRAPlugin"
HEALTH_V1_SERVICE = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1_SERVICE = "v1alpha1.DRAResourceHealth"

# PluginInfo.type for a DRA driver.
PLUGIN_TYPE = "DRAPlugin"

_FULL_SERVICE_NAMES = {
    DRA_V1_SERVICE: dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name,
    HEALTH_V1_SERVICE: health_v1.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name,
    HEALTH_V1ALPHA1_SERVICE: health_v1alpha1.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name,
}


def full_service_name(identifier: str) -> str:
    """The fully qualified gRPC service name behind an advertised identifier.

    Useful for gRPC reflection/health registration, which need the real service name.
    """
    try:
        return _FULL_SERVICE_NAMES[identifier]
    except KeyError:
        known = ", ".join(sorted(_FULL_SERVICE_NAMES))
        raise ValueError(f"unknown service identifier {identifier!r}; known: {known}") from None
