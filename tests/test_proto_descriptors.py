"""The generated stubs must speak exactly the kubelet's wire contracts.

The expected tables below are transcribed from the kubelet's api.proto files (DRA v1/v1beta1,
dra-health v1alpha1, pluginregistration). A renamed field, changed number or type, a lost
``optional`` or a different package line would make the kubelet fail to talk to the driver,
so every one of them is checked here against the loaded descriptors.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from dra_gpu import proto

REPO = Path(__file__).resolve().parent.parent
GEN = REPO / "tools" / "gen_protos.py"

# message -> field name -> (number, type as written in the .proto)
_DRA_MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
    "NodePrepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodePrepareResourcesResponse": {"claims": (1, "map<string, NodePrepareResourceResponse>")},
    "NodePrepareResourceResponse": {"devices": (1, "repeated Device"), "error": (2, "string")},
    "Device": {
        "request_names": (1, "repeated string"),
        "pool_name": (2, "string"),
        "device_name": (3, "string"),
        "cdi_device_ids": (4, "repeated string"),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodeUnprepareResourcesResponse": {"claims": (1, "map<string, NodeUnprepareResourceResponse>")},
    "NodeUnprepareResourceResponse": {"error": (1, "string")},
    "Claim": {"namespace": (1, "string"), "uid": (2, "string"), "name": (3, "string")},
}
_DRA_V1_MESSAGES = {
    **_DRA_MESSAGES,
    "Device": {**_DRA_MESSAGES["Device"], "share_id": (5, "optional string")},
}

# (file name, package, messages, enums: name -> {value: number},
#  services: name -> {method: (input, output, client streaming, server streaming)})
EXPECTED = {
    "dra/v1/api.proto": (
        "k8s.io.kubelet.pkg.apis.dra.v1",
        _DRA_V1_MESSAGES,
        {},
        {
            "DRAPlugin": {
                "NodePrepareResources": (
                    "NodePrepareResourcesRequest",
                    "NodePrepareResourcesResponse",
                    False,
                    False,
                ),
                "NodeUnprepareResources": (
                    "NodeUnprepareResourcesRequest",
                    "NodeUnprepareResourcesResponse",
                    False,
                    False,
                ),
            }
        },
    ),
    "dra/v1beta1/api.proto": (
        "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        _DRA_MESSAGES,
        {},
        {
            "DRAPlugin": {
                "NodePrepareResources": (
                    "NodePrepareResourcesRequest",
                    "NodePrepareResourcesResponse",
                    False,
                    False,
                ),
                "NodeUnprepareResources": (
                    "NodeUnprepareResourcesRequest",
                    "NodeUnprepareResourcesResponse",
                    False,
                    False,
                ),
            }
        },
    ),
    "drahealth/v1alpha1/api.proto": (
        "v1alpha1",
        {
            "NodeWatchResourcesRequest": {},
            "DeviceIdentifier": {"pool_name": (1, "string"), "device_name": (2, "string")},
            "DeviceHealth": {
                "device": (1, "DeviceIdentifier"),
                "health": (2, "HealthStatus"),
                "last_updated_time": (3, "int64"),
                "health_check_timeout_seconds": (4, "int64"),
                "message": (5, "string"),
            },
            "NodeWatchResourcesResponse": {"devices": (1, "repeated DeviceHealth")},
        },
        {"HealthStatus": {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}},
        {
            "DRAResourceHealth": {
                "NodeWatchResources": (
                    "NodeWatchResourcesRequest",
                    "NodeWatchResourcesResponse",
                    False,
                    True,
                ),
            }
        },
    ),
    "pluginregistration/v1/api.proto": (
        "pluginregistration",
        {
            "InfoRequest": {},
            "PluginInfo": {
                "type": (1, "string"),
                "name": (2, "string"),
                "endpoint": (3, "string"),
                "supported_versions": (4, "repeated string"),
            },
            "RegistrationStatus": {"plugin_registered": (1, "bool"), "error": (2, "string")},
            "RegistrationStatusResponse": {},
        },
        {},
        {
            "Registration": {
                "GetInfo": ("InfoRequest", "PluginInfo", False, False),
                "NotifyRegistrationStatus": (
                    "RegistrationStatus",
                    "RegistrationStatusResponse",
                    False,
                    False,
                ),
            }
        },
    ),
}

# The method paths the kubelet dials, verbatim from its *_FullMethodName constants.
EXPECTED_METHOD_PATHS = {
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    "/pluginregistration.Registration/GetInfo",
    "/pluginregistration.Registration/NotifyRegistrationStatus",
}

MODULES = {
    "dra/v1/api.proto": proto.dra_v1,
    "dra/v1beta1/api.proto": proto.dra_v1beta1,
    "drahealth/v1alpha1/api.proto": proto.health_v1alpha1,
    "pluginregistration/v1/api.proto": proto.registration,
}

_SCALARS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
}


def _file_proto(name: str) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    MODULES[name].DESCRIPTOR.CopyToProto(fdp)
    return fdp


def _type_name(field: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    if field.type in _SCALARS:
        return _SCALARS[field.type]
    prefix = f".{package}."
    assert field.type_name.startswith(prefix), f"{field.name}: {field.type_name} is outside package {package}"
    return field.type_name[len(prefix) :]


def _render(
    field: descriptor_pb2.FieldDescriptorProto, msg: descriptor_pb2.DescriptorProto, package: str
) -> str:
    """Write a field's type the way the .proto source spells it."""
    base = _type_name(field, package)
    if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        entry = next((n for n in msg.nested_type if f"{msg.name}.{n.name}" == base), None)
        if entry is not None and entry.options.map_entry:
            key, value = (_type_name(f, package) for f in entry.field)
            return f"map<{key}, {value.removeprefix(f'{msg.name}.')}>"
        return f"repeated {base}"
    return f"optional {base}" if field.proto3_optional else base


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_package_messages_and_fields_match_kubelet(name: str) -> None:
    package, messages, enums, _ = EXPECTED[name]
    fdp = _file_proto(name)
    assert fdp.name == name
    assert fdp.package == package
    assert fdp.syntax == "proto3"
    assert {m.name for m in fdp.message_type} == set(messages)
    for msg in fdp.message_type:
        got = {f.name: (f.number, _render(f, msg, package)) for f in msg.field}
        assert got == messages[msg.name], f"{package}.{msg.name}"
    assert {e.name: {v.name: v.number for v in e.value} for e in fdp.enum_type} == enums


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_services_methods_and_streaming_match_kubelet(name: str) -> None:
    package, _, _, services = EXPECTED[name]
    file_desc = MODULES[name].DESCRIPTOR
    assert set(file_desc.services_by_name) == set(services)
    for svc_name, methods in services.items():
        svc = file_desc.services_by_name[svc_name]
        assert svc.full_name == f"{package}.{svc_name}"
        assert set(svc.methods_by_name) == set(methods)
        svc_proto = descriptor_pb2.ServiceDescriptorProto()
        svc.CopyToProto(svc_proto)
        for m in svc_proto.method:
            want_in, want_out, client_streaming, server_streaming = methods[m.name]
            assert m.input_type == f".{package}.{want_in}"
            assert m.output_type == f".{package}.{want_out}"
            assert (m.client_streaming, m.server_streaming) == (client_streaming, server_streaming), m.name


def test_method_paths_are_the_ones_the_kubelet_dials() -> None:
    paths = {
        f"/{svc.full_name}/{method.name}"
        for module in MODULES.values()
        for svc in module.DESCRIPTOR.services_by_name.values()
        for method in svc.methods
    }
    assert paths == EXPECTED_METHOD_PATHS


def test_share_id_is_a_proto3_optional_only_in_v1() -> None:
    v1 = proto.dra_v1.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert v1.has_presence
    assert "share_id" not in proto.dra_v1beta1.Device.DESCRIPTOR.fields_by_name


def test_all_files_load_together_into_one_fresh_pool() -> None:
    pool = descriptor_pool.DescriptorPool()
    for name in sorted(EXPECTED):
        pool.Add(_file_proto(name))
    for name, (package, _, _, services) in EXPECTED.items():
        assert pool.FindFileByName(name).package == package
        for svc in services:
            assert pool.FindServiceByName(f"{package}.{svc}").file.name == name
    # The default pool (used by the generated modules) holds them under distinct names too.
    default = descriptor_pool.Default()
    assert {default.FindFileByName(n).name for n in EXPECTED} == set(EXPECTED)


def test_advertised_identifiers_map_to_full_service_names() -> None:
    assert proto.PLUGIN_TYPE == "DRAPlugin"
    assert proto.full_service_name(proto.DRA_V1_SERVICE) == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert (
        proto.full_service_name(proto.DRA_V1BETA1_SERVICE) == "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    )
    assert proto.full_service_name(proto.HEALTH_V1ALPHA1_SERVICE) == "v1alpha1.DRAResourceHealth"
    with pytest.raises(ValueError, match=r"unknown service identifier 'v1alpha3\.NodeService'"):
        proto.full_service_name("v1alpha3.NodeService")


# --- the committed stubs are what the generator produces ------------------------------------------


def _gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GEN), *args], capture_output=True, text=True, check=False, cwd=REPO, timeout=120
    )


def test_committed_stubs_are_up_to_date() -> None:
    result = _gen("--check")
    assert result.returncode == 0, result.stderr


def test_check_names_stale_and_missing_stub_files(tmp_path: Path) -> None:
    copy = tmp_path / "_proto"
    shutil.copytree(REPO / "src" / "dra_gpu" / "_proto", copy, ignore=shutil.ignore_patterns("__pycache__"))
    stub = copy / "dra" / "v1" / "api_pb2.py"
    stub.write_text(stub.read_text().replace("share_id", "shared_id"))
    (copy / "pluginregistration" / "v1" / "api_pb2_grpc.pyi").unlink()
    result = _gen("--check", "--out", str(copy))
    assert result.returncode == 1
    assert "stale:   " in result.stderr and "dra/v1/api_pb2.py" in result.stderr
    assert "missing: " in result.stderr and "pluginregistration/v1/api_pb2_grpc.pyi" in result.stderr
    assert "run `python tools/gen_protos.py`" in result.stderr


# --- a real gRPC server on a unix socket ---------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the 107-byte AF_UNIX path limit; use a short one.
    path = Path(tempfile.mkdtemp(prefix="dra-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _cdi_ids(claim_uid: str) -> list[str]:
    return [f"k8s.gpu-x/claim={claim_uid}"]


class _V1(proto.dra_v1_grpc.DRAPluginServicer):
    def NodePrepareResources(
        self, request: proto.dra_v1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> proto.dra_v1.NodePrepareResourcesResponse:
        resp = proto.dra_v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            dev = resp.claims[claim.uid].devices.add(
                pool_name="node-a", device_name="gpu-0", cdi_device_ids=_cdi_ids(claim.uid)
            )
            # The namespace picks the share_id case: set, explicitly empty, or absent.
            if claim.namespace == "shared":
                dev.share_id = f"share-{claim.name}"
            elif claim.namespace == "empty":
                dev.share_id = ""
        return resp

    def NodeUnprepareResources(
        self, request: proto.dra_v1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> proto.dra_v1.NodeUnprepareResourcesResponse:
        resp = proto.dra_v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            resp.claims[claim.uid].error = "" if claim.name else "missing name"
        return resp


class _V1beta1(proto.dra_v1beta1_grpc.DRAPluginServicer):
    def NodePrepareResources(
        self, request: proto.dra_v1beta1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> proto.dra_v1beta1.NodePrepareResourcesResponse:
        resp = proto.dra_v1beta1.NodePrepareResourcesResponse()
        for claim in request.claims:
            resp.claims[claim.uid].devices.add(
                pool_name="node-a", device_name="gpu-0", cdi_device_ids=_cdi_ids(claim.uid)
            )
        return resp


@pytest.fixture
def channel(socket_dir: Path) -> Iterator[grpc.Channel]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    proto.dra_v1_grpc.add_DRAPluginServicer_to_server(_V1(), server)
    proto.dra_v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1(), server)
    sock = socket_dir / "dra.sock"
    assert server.add_insecure_port(f"unix://{sock}") != 0
    server.start()
    try:
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            grpc.channel_ready_future(ch).result(timeout=10)
            yield ch
    finally:
        server.stop(grace=None)


def test_server_serves_v1_with_share_id_presence(channel: grpc.Channel) -> None:
    stub = proto.dra_v1_grpc.DRAPluginStub(channel)
    claims = [
        proto.dra_v1.Claim(namespace="shared", uid="uid-1", name="one"),
        proto.dra_v1.Claim(namespace="plain", uid="uid-2", name="whole"),
        proto.dra_v1.Claim(namespace="empty", uid="uid-3", name="blank"),
    ]
    resp = stub.NodePrepareResources(proto.dra_v1.NodePrepareResourcesRequest(claims=claims), timeout=10)
    assert set(resp.claims) == {"uid-1", "uid-2", "uid-3"}
    shared, plain, empty = (resp.claims[u].devices[0] for u in ("uid-1", "uid-2", "uid-3"))
    assert shared.HasField("share_id") and shared.share_id == "share-one"
    assert list(shared.cdi_device_ids) == ["k8s.gpu-x/claim=uid-1"]
    assert not plain.HasField("share_id")
    assert empty.HasField("share_id") and empty.share_id == ""

    unprep = stub.NodeUnprepareResources(
        proto.dra_v1.NodeUnprepareResourcesRequest(claims=claims[:1]), timeout=10
    )
    assert set(unprep.claims) == {"uid-1"} and unprep.claims["uid-1"].error == ""


def test_server_serves_v1beta1_on_the_same_socket(channel: grpc.Channel) -> None:
    stub = proto.dra_v1beta1_grpc.DRAPluginStub(channel)
    req = proto.dra_v1beta1.NodePrepareResourcesRequest(
        claims=[proto.dra_v1beta1.Claim(namespace="ns", uid="uid-9", name="c")]
    )
    resp = stub.NodePrepareResources(req, timeout=10)
    assert resp.claims["uid-9"].devices[0].device_name == "gpu-0"
    # Unimplemented methods answer UNIMPLEMENTED, as the kubelet expects from a partial plugin.
    with pytest.raises(grpc.RpcError) as err:
        stub.NodeUnprepareResources(proto.dra_v1beta1.NodeUnprepareResourcesRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_kubelet_method_path_reaches_the_server(channel: grpc.Channel) -> None:
    """Dial the literal path the kubelet uses, bypassing our generated client stub."""
    call = channel.unary_unary(
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        request_serializer=proto.dra_v1.NodePrepareResourcesRequest.SerializeToString,
        response_deserializer=proto.dra_v1.NodePrepareResourcesResponse.FromString,
    )
    req = proto.dra_v1.NodePrepareResourcesRequest(
        claims=[proto.dra_v1.Claim(namespace="shared", uid="u", name="n")]
    )
    assert call(req, timeout=10).claims["u"].devices[0].share_id == "share-n"


def test_v1_share_id_is_skipped_by_a_v1beta1_reader() -> None:
    """What an older kubelet sees: the unknown field 5 is ignored, everything else survives."""
    wire = proto.dra_v1.Device(
        request_names=["gpu"], pool_name="p", device_name="d", cdi_device_ids=["v.x/c=1"], share_id="s"
    ).SerializeToString()
    old = proto.dra_v1beta1.Device.FromString(wire)
    assert (list(old.request_names), old.pool_name, old.device_name, list(old.cdi_device_ids)) == (
        ["gpu"],
        "p",
        "d",
        ["v.x/c=1"],
    )
    with pytest.raises(ValueError, match="share_id"):
        proto.dra_v1beta1.Device(share_id="s")  # type: ignore[call-arg]
