"""The generated stubs must speak exactly the kubelet's wire contracts.

The expected tables below are transcribed from the kubelet's api.proto files (DRA v1,
dra-health v1 and v1alpha1, pluginregistration). A renamed field, changed number or type, a lost
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
from repo_paths import ROOT

from dra_gpu import proto

REPO = ROOT
GEN = REPO / "tools" / "gen_protos.py"

# message -> field name -> (number, type as written in the .proto)
_DRA_V1_MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
    "NodePrepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodePrepareResourcesResponse": {"claims": (1, "map<string, NodePrepareResourceResponse>")},
    "NodePrepareResourceResponse": {"devices": (1, "repeated Device"), "error": (2, "string")},
    "Device": {
        "request_names": (1, "repeated string"),
        "pool_name": (2, "string"),
        "device_name": (3, "string"),
        "cdi_device_ids": (4, "repeated string"),
        "share_id": (5, "optional string"),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodeUnprepareResourcesResponse": {"claims": (1, "map<string, NodeUnprepareResourceResponse>")},
    "NodeUnprepareResourceResponse": {"error": (1, "string")},
    "Claim": {"namespace": (1, "string"), "uid": (2, "string"), "name": (3, "string")},
}

# dra-health v1 (kubelet 1.37+) has exactly the messages of v1alpha1, under the package `v1`.
_HEALTH_MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
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
}
_HEALTH_ENUMS = {"HealthStatus": {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}}
_HEALTH_SERVICES = {
    "DRAResourceHealth": {
        "NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse", False, True),
    }
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
    "drahealth/v1/api.proto": ("v1", _HEALTH_MESSAGES, _HEALTH_ENUMS, _HEALTH_SERVICES),
    "drahealth/v1alpha1/api.proto": ("v1alpha1", _HEALTH_MESSAGES, _HEALTH_ENUMS, _HEALTH_SERVICES),
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
    "/v1.DRAResourceHealth/NodeWatchResources",
    "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    "/pluginregistration.Registration/GetInfo",
    "/pluginregistration.Registration/NotifyRegistrationStatus",
}

MODULES = {
    "dra/v1/api.proto": proto.dra_v1,
    "drahealth/v1/api.proto": proto.health_v1,
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


def test_share_id_is_a_proto3_optional() -> None:
    assert proto.dra_v1.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence


def test_health_v1_and_v1alpha1_are_the_same_on_the_wire() -> None:
    """A kubelet reading either version gets every field the other wrote."""
    for write, read in ((proto.health_v1, proto.health_v1alpha1), (proto.health_v1alpha1, proto.health_v1)):
        sent = write.NodeWatchResourcesResponse(
            devices=[
                write.DeviceHealth(
                    device=write.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
                    health=write.UNHEALTHY,
                    last_updated_time=1_800_000_000,
                    health_check_timeout_seconds=30,
                    message="XID 79",
                )
            ]
        )
        got = read.NodeWatchResourcesResponse.FromString(sent.SerializeToString())
        (device,) = got.devices
        assert (device.device.pool_name, device.device.device_name) == ("node-a", "gpu-0")
        assert device.health == read.UNHEALTHY
        assert (device.last_updated_time, device.health_check_timeout_seconds, device.message) == (
            1_800_000_000,
            30,
            "XID 79",
        )


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
    assert proto.full_service_name(proto.HEALTH_V1_SERVICE) == "v1.DRAResourceHealth"
    assert proto.full_service_name(proto.HEALTH_V1ALPHA1_SERVICE) == "v1alpha1.DRAResourceHealth"
    # The identifiers the kubelet's own constants define (`DRAResourceHealthService` per package).
    assert (proto.HEALTH_V1_SERVICE, proto.HEALTH_V1ALPHA1_SERVICE) == (
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    )
    with pytest.raises(ValueError, match=r"unknown service identifier 'v1beta1\.DRAPlugin'"):
        proto.full_service_name("v1beta1.DRAPlugin")


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


@pytest.fixture
def channel(socket_dir: Path) -> Iterator[grpc.Channel]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    proto.dra_v1_grpc.add_DRAPluginServicer_to_server(_V1(), server)
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
