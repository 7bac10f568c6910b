"""The kubelet plugin end to end: a test kubelet registers over the registration socket, then prepares
and unprepares claims over the service socket with real gRPC, and resolves the returned CDI ids with
the CDI library to see what a container would get."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from plugin_harness import (
    DRIVER,
    NODE,
    PROFILE,
    Alloc,
    add_claim,
    cdi_ids,
    gpu_config,
    opaque,
    resolve,
    running_plugin,
    simulated_gpu_state,
    uid_of,
)
from waiting import wait_for

from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube import builders
from dra_gpu.limiter_abi.limits import CONTAINER_LIBRARY, CONTAINER_PRELOAD
from dra_gpu.limiter_abi.region import read_region
from dra_gpu.plugin.sharing.modes.limiter import container_claim_dir
from dra_gpu.proto import health_v1, health_v1_grpc, health_v1alpha1, health_v1alpha1_grpc

SHARE_A = "0f6e3a4e-5d2c-4b8a-9d55-1c0e7f3a9b01"
SHARE_B = "7a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
GPUS = SimulatedInventory(PROFILE, seed=NODE).gpus()
GPU0, GPU1 = GPUS[0].uuid, GPUS[1].uuid


def test_registration_advertises_dra_v1_both_health_versions_and_the_service_socket(
    dirs, api, kubelet
) -> None:
    with running_plugin(dirs, api) as plugin:
        info = kubelet.register()
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(dirs.service_socket)
        # DRA v1 only (no v1beta1 fallback); health v1 first, the order a 1.37+ kubelet reads in.
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        assert plugin.plugin.registered.is_set()


def test_a_refused_registration_is_a_loud_error(dirs, api, kubelet, caplog) -> None:
    caplog.set_level(logging.INFO)
    with running_plugin(dirs, api) as plugin:
        kubelet.register(accept=False, error="plugin version not supported")
        refusals = [r for r in caplog.records if r.levelno == logging.ERROR and "REFUSED" in r.getMessage()]
        assert refusals and getattr(refusals[0], "error", "") == "plugin version not supported"
        assert not plugin.plugin.registered.is_set()
        assert plugin.plugin.registration_error == "plugin version not supported"


def test_exclusive_claim_gets_its_gpu_device_nodes_and_visibility(dirs, api, kubelet) -> None:
    dirs.make_device_nodes()
    claim = add_claim(api, "whole", [Alloc(device="gpu-1")], [opaque(gpu_config("Exclusive"))])
    with running_plugin(dirs, api):
        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert response.error == ""
        (device,) = response.devices
        assert (device.pool_name, device.device_name, list(device.request_names)) == (NODE, "gpu-1", ["gpu"])
        assert list(device.cdi_device_ids) == [f"{DRIVER}/claim={uid_of(claim)}-gpu-1"]
        container = resolve(dirs, cdi_ids(response))
        # The device node is the visibility; no claim-wide variable lists GPUs.
        assert container.env["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert "CUDA_VISIBLE_DEVICES" not in container.env
        assert container.env["DRAGPU_DEVICE_GPU_1"] == GPU1
        assert "LD_PRELOAD" not in container.env
        nodes = {n.path: n.host_path for n in container.device_nodes}
        assert set(nodes) == {"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
        assert nodes["/dev/nvidia1"] == str(dirs.dev_root / "dev" / "nvidia1")

        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert dirs.spec_files() == []


def test_no_device_nodes_are_listed_where_the_host_has_none(dirs, api, kubelet) -> None:
    claim = add_claim(api, "whole", [Alloc(device="gpu-0")])
    with running_plugin(dirs, api):
        kubelet.register()
        container = resolve(dirs, cdi_ids(kubelet.prepare(claim)[uid_of(claim)]))
        assert container.device_nodes == []
        assert container.env["DRAGPU_DEVICE_GPU_0"] == GPU0


def test_the_toolkit_device_is_returned_beside_ours_when_its_spec_exists(dirs, api, kubelet) -> None:
    dirs.make_device_nodes()
    (dirs.ctk_dir / "nvidia.yaml").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": [
                    {"name": name, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
                    for name in ("0", GPU0, "all")
                ],
                "containerEdits": {"env": ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"]},
            }
        )
    )
    claim = add_claim(api, "whole", [Alloc(device="gpu-0")])
    with running_plugin(dirs, api):
        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert list(response.devices[0].cdi_device_ids) == [
            f"{DRIVER}/claim={uid_of(claim)}-gpu-0",
            f"nvidia.com/gpu={GPU0}",
        ]
        ours = json.loads(next(dirs.cdi_dir.glob("*.json")).read_text())
        assert "deviceNodes" not in json.dumps(ours), "the toolkit's device brings the nodes"
        container = resolve(dirs, cdi_ids(response))
        assert [n.path for n in container.device_nodes] == ["/dev/nvidia0"]
        assert container.env["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert container.env["NVIDIA_CTK_LIBCUDA_DIR"] == "/usr/lib/x86_64-linux-gnu"


def test_limiter_claims_get_the_library_their_state_dir_and_their_share(dirs, api, kubelet) -> None:
    a = add_claim(
        api,
        "share-a",
        [Alloc(share_id=SHARE_A, consumed={"memory": "10Gi", "cores": "30"})],
        [opaque(gpu_config("Limiter"))],
    )
    b = add_claim(
        api,
        "share-b",
        [Alloc(share_id=SHARE_B, consumed={"memory": "11Gi", "cores": "20"})],
        [opaque(gpu_config("Limiter"))],
    )
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(a, b)
        for claim, share, memory, cores in ((a, SHARE_A, 10 << 30, "30"), (b, SHARE_B, 11 << 30, "20")):
            response = answers[uid_of(claim)]
            assert response.error == ""
            assert response.devices[0].share_id == share
            container = resolve(dirs, cdi_ids(response))
            inside = container_claim_dir(uid_of(claim))
            limits = container.mount_for(f"{inside}/limits")
            assert limits is not None and "ro" in (limits.options or [])
            assert limits.host_path == str(dirs.state_dir / "claims" / uid_of(claim) / "limits")
            assert stat.S_IMODE(os.stat(limits.host_path).st_mode) == 0o444
            assert Path(limits.host_path).read_text() == (
                f"version=1\nclaim=default/{claim['metadata']['name']}\nstate={inside}/limiter\n"
                f"device={GPU0} memory={memory} cores={cores}\n"
            )
            preload = container.mount_for(CONTAINER_PRELOAD)
            assert preload is not None and Path(preload.host_path).read_text() == CONTAINER_LIBRARY + "\n"
            # No limiter environment: another claim of the same container would overwrite it.
            assert not any(
                k.startswith(("LD_PRELOAD", "DRAGPU_LIMITER", "DRAGPU_MEMORY", "DRAGPU_CORES"))
                for k in container.env
            )
            library = container.mount_for(CONTAINER_LIBRARY)
            assert library is not None and library.host_path == str(dirs.limiter_library)
            assert "ro" in (library.options or [])
            # The containers cannot unlink, replace or add to the claim's accounting: the directory is
            # read-only, the region the agent made is a read-write mount of its own, usable by any UID.
            state = container.mount_for(f"{inside}/limiter")
            assert state is not None and "ro" in (state.options or [])
            assert state.host_path == str(dirs.state_dir / "claims" / uid_of(claim) / "limiter")
            assert stat.S_IMODE(os.stat(state.host_path).st_mode) == 0o755
            region = container.mount_for(f"{inside}/limiter/dragpu-limiter.region")
            assert region is not None and "rw" in (region.options or [])
            assert region.host_path == f"{state.host_path}/dragpu-limiter.region"
            assert stat.S_IMODE(os.stat(region.host_path).st_mode) == 0o666, "pods of any user share it"
            assert read_region(state.host_path) == [], "laid out by the agent, no device yet"
        assert sorted(dirs.claim_dirs()) == sorted([uid_of(a), uid_of(b)])

        assert kubelet.unprepare(a, b) == {uid_of(a): "", uid_of(b): ""}
        assert dirs.claim_dirs() == [] and dirs.spec_files() == []


def test_limiter_limits_come_from_the_config_without_consumable_capacity(dirs, api, kubelet) -> None:
    claim = add_claim(
        api,
        "no-cc",
        [Alloc(device="gpu-1")],
        [opaque(gpu_config("Limiter", limiter={"memory": "4Gi", "cores": 25}))],
    )
    with running_plugin(dirs, api):
        kubelet.register()
        kubelet.prepare(claim)
        limits = dirs.state_dir / "claims" / uid_of(claim) / "limits"
        assert limits.read_text().splitlines()[-1] == f"device={GPU1} memory={4 << 30} cores=25"


def test_multi_gpu_limiter_claim_has_one_limits_line_per_gpu(dirs, api, kubelet) -> None:
    claim = add_claim(
        api,
        "two",
        [
            Alloc(device="gpu-1", request="a", share_id=SHARE_A, consumed={"memory": "2Gi", "cores": "40"}),
            Alloc(device="gpu-0", request="b", share_id=SHARE_B, consumed={"memory": "3Gi", "cores": "50"}),
        ],
        [opaque(gpu_config("Limiter"))],
    )
    with running_plugin(dirs, api):
        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert [list(d.request_names) for d in response.devices] == [["a"], ["b"]]
        container = resolve(dirs, cdi_ids(response))
        assert "CUDA_VISIBLE_DEVICES" not in container.env
        limits = dirs.state_dir / "claims" / uid_of(claim) / "limits"
        assert limits.read_text().splitlines()[3:] == [
            f"device={GPU1} memory={2 << 30} cores=40",
            f"device={GPU0} memory={3 << 30} cores=50",
        ]


def test_time_slicing_sets_the_interval_once_and_restores_it_after_the_last_claim(dirs, api, kubelet) -> None:
    commands = SimulatedCommands(state_file=dirs.simulated_state)
    ts = [opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Long"}))]
    a = add_claim(
        api, "ts-a", [Alloc(device="gpu-1", share_id=SHARE_A, consumed={"memory": "8Gi", "cores": "10"})], ts
    )
    b = add_claim(
        api, "ts-b", [Alloc(device="gpu-1", share_id=SHARE_B, consumed={"memory": "8Gi", "cores": "10"})], ts
    )
    with running_plugin(dirs, api, commands=commands):
        kubelet.register()
        assert all(r.error == "" for r in kubelet.prepare(a).values())
        assert kubelet.prepare(a)[uid_of(a)].devices[0].share_id == SHARE_A  # repeated: same answer
        assert simulated_gpu_state(dirs)["timeslice"] == {"1": 3}
        assert commands.calls.count(("set_timeslice", "1", "3")) == 1, "a repeated prepare sets nothing again"
        assert kubelet.prepare(b)[uid_of(b)].error == ""
        container = resolve(dirs, cdi_ids(kubelet.prepare(b)[uid_of(b)]))
        assert container.env["DRAGPU_DEVICE_GPU_1"] == GPU1
        assert kubelet.unprepare(a) == {uid_of(a): ""}
        assert simulated_gpu_state(dirs)["timeslice"] == {"1": 3}, "claim b still relies on it"
        assert kubelet.unprepare(b) == {uid_of(b): ""}
        assert simulated_gpu_state(dirs)["timeslice"] == {}


def test_mps_claims_share_one_daemon_per_gpu_with_their_own_limits(dirs, api, kubelet) -> None:
    commands = SimulatedCommands(state_file=dirs.simulated_state)
    mps = [opaque(gpu_config("MPS"))]
    a = add_claim(api, "mps-a", [Alloc(share_id=SHARE_A, consumed={"memory": "20Gi", "cores": "25"})], mps)
    b = add_claim(api, "mps-b", [Alloc(share_id=SHARE_B, consumed={"memory": "8Gi", "cores": "50"})], mps)
    pipe = dirs.state_dir / "mps" / GPU0 / "pipe"
    with running_plugin(dirs, api, commands=commands):
        kubelet.register()
        answers = kubelet.prepare(a, b)
        for claim, memory_mib, cores in ((a, 20480, "25"), (b, 8192, "50")):
            container = resolve(dirs, cdi_ids(answers[uid_of(claim)]))
            assert container.env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
            assert container.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == cores
            assert container.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={memory_mib}M"
            mount = container.mount_for("/tmp/nvidia-mps")
            assert mount is not None and mount.host_path == str(pipe)
        assert pipe.is_dir()
        state = simulated_gpu_state(dirs)
        assert state["computeMode"] == {GPU0: "EXCLUSIVE_PROCESS"}
        assert state["mps"] == {GPU0: str(pipe)}
        assert [c[0] for c in commands.calls].count("start_mps_daemon") == 1, "one daemon for both claims"

        assert kubelet.unprepare(a) == {uid_of(a): ""}
        assert simulated_gpu_state(dirs)["mps"] == {GPU0: str(pipe)}, "claim b still uses the daemon"
        assert kubelet.unprepare(b) == {uid_of(b): ""}
        state = simulated_gpu_state(dirs)
        assert state["mps"] == {} and state["computeMode"] == {}
        assert not pipe.parent.exists()


def test_mps_limits_fall_back_to_the_config_defaults(dirs, api, kubelet) -> None:
    config = gpu_config(
        "MPS", mps={"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "6Gi"}
    )
    claim = add_claim(api, "mps", [Alloc()], [opaque(config)])
    with running_plugin(dirs, api):
        kubelet.register()
        container = resolve(dirs, cdi_ids(kubelet.prepare(claim)[uid_of(claim)]))
        assert container.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
        assert container.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"


def test_a_crashed_mps_daemon_is_restarted(dirs, api, kubelet) -> None:
    commands = SimulatedCommands(state_file=dirs.simulated_state)
    claim = add_claim(api, "mps", [Alloc()], [opaque(gpu_config("MPS"))])
    with running_plugin(dirs, api, commands=commands, supervise_interval_s=3600) as plugin:
        kubelet.register()
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        commands.kill_mps_daemon(GPU0)
        assert simulated_gpu_state(dirs)["mps"] == {}
        plugin.plugin.preparer.supervise()
        assert GPU0 in simulated_gpu_state(dirs)["mps"]
        assert plugin.plugin.metrics.setup_repairs.labels(kind="mps")._value.get() == 1


def test_the_deprecated_v1beta1_dra_service_is_not_served(dirs, api, kubelet) -> None:
    """What a kubelet dialling v1beta1 gets: UNIMPLEMENTED, never a half-answer."""
    with running_plugin(dirs, api):
        kubelet.register()
        call = kubelet.channel().unary_unary(
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
            request_serializer=lambda _: b"",
            response_deserializer=lambda data: data,
        )
        with pytest.raises(grpc.RpcError) as err:
            call(None, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_subrequest_results_answer_with_the_base_request_name(dirs, api, kubelet) -> None:
    claim = add_claim(api, "prio", [Alloc(request="gpu/big", device="gpu-1")])
    with running_plugin(dirs, api):
        kubelet.register()
        assert list(kubelet.prepare(claim)[uid_of(claim)].devices[0].request_names) == ["gpu"]


def test_unprepare_needs_neither_the_claim_nor_a_previous_prepare(dirs, api, kubelet) -> None:
    claim = add_claim(
        api,
        "gone",
        [Alloc(device="gpu-1")],
        [opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Short"}))],
    )
    with running_plugin(dirs, api):
        kubelet.register()
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        api.delete("ResourceClaim", "gone", "default")
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert simulated_gpu_state(dirs)["timeslice"] == {}
        assert dirs.spec_files() == []
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}, "unprepare of an unknown claim succeeds"


def test_health_services_and_http_endpoints(dirs, api, kubelet) -> None:
    inventory = SimulatedInventory(PROFILE, seed=NODE)
    claim = add_claim(
        api,
        "lim",
        [Alloc(share_id=SHARE_A, consumed={"memory": "1Gi", "cores": "5"})],
        [opaque(gpu_config("Limiter"))],
    )
    with running_plugin(
        dirs, api, inventory=inventory, http_address="127.0.0.1:0", health_heartbeat_s=0.2
    ) as plugin:
        kubelet.register()
        with grpc.insecure_channel(f"unix://{dirs.service_socket}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            for service in ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"):
                check = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=5
                )
                assert check.status == health_pb2.HealthCheckResponse.SERVING, service
            # The same stream over both versions at once: v1 (a 1.37+ kubelet) and v1alpha1 (older).
            streams = {
                pb: grpc_mod.DRAResourceHealthStub(channel).NodeWatchResources(
                    pb.NodeWatchResourcesRequest(), timeout=20
                )
                for pb, grpc_mod in ((health_v1, health_v1_grpc), (health_v1alpha1, health_v1alpha1_grpc))
            }
            for pb, stream in streams.items():
                first = next(stream)
                assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices] == [
                    (NODE, "gpu-0", pb.HEALTHY),
                    (NODE, "gpu-1", pb.HEALTHY),
                ]
            inventory.set_health(1, False, "XID 79: GPU has fallen off the bus")
            for pb, stream in streams.items():
                for message in stream:
                    if message.devices[1].health == pb.UNHEALTHY:
                        assert message.devices[1].message == "XID 79: GPU has fallen off the bus"
                        assert message.devices[0].health == pb.HEALTHY
                        break
                stream.cancel()

        base = f"http://127.0.0.1:{plugin.http_port}"
        with urllib.request.urlopen(f"{base}/healthz") as reply:
            assert reply.status == 200 and reply.read().startswith(b"ok")
        kubelet.prepare(claim)
        kubelet.prepare(("default", "missing", "no-such-uid"))
        with urllib.request.urlopen(f"{base}/metrics") as reply:
            metrics = reply.read().decode()
        assert "dra_gpu_prepare_duration_seconds_count 2.0" in metrics
        assert "dra_gpu_prepared_claims 1.0" in metrics
        assert f'dra_gpu_gpu_shares{{device="gpu-0",gpu_uuid="{GPU0}",strategy="Limiter"}} 1.0' in metrics
        assert 'dra_gpu_claim_errors_total{operation="prepare",reason="claim_not_found"} 1.0' in metrics
        dirs.service_socket.unlink()
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"{base}/healthz")
        assert failed.value.code == 503 and b"dra.sock does not exist" in failed.value.read()


def test_sockets_are_private_stale_ones_replaced_and_removed_on_stop(dirs, api, kubelet) -> None:
    dirs.registration_dir.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(dirs.registration_socket))
    stale.close()  # a dead plugin's socket: the file stays, nobody listens
    with running_plugin(dirs, api):
        kubelet.register()
        for path in (dirs.registration_socket, dirs.service_socket):
            mode = os.stat(path).st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) & 0o077 == 0
        assert stat.S_IMODE(os.stat(dirs.plugins_dir / DRIVER).st_mode) & 0o007 == 0
        assert stat.S_IMODE(os.stat(dirs.state_dir).st_mode) & 0o007 == 0
    assert not dirs.registration_socket.exists() and not dirs.service_socket.exists()


def test_a_file_in_the_way_of_a_socket_is_not_deleted(dirs, api) -> None:
    dirs.registration_dir.mkdir(parents=True)
    dirs.registration_socket.write_text("not a socket")
    with (
        pytest.raises(ValueError, match="exists and is not a socket; refusing to remove it"),
        running_plugin(dirs, api),
    ):
        pass
    assert dirs.registration_socket.read_text() == "not a socket"
    assert not dirs.service_socket.exists()


def test_the_node_agent_publishes_its_gpus(dirs, api) -> None:
    api.create("Node", builders.node(NODE))
    with running_plugin(dirs, api, publish_slices=True, sharing="*=Shared,1=MPS"):
        (published,) = wait_for(lambda: api.objects("ResourceSlice"), what="a published ResourceSlice")
        assert published["spec"]["nodeName"] == NODE and published["spec"]["pool"]["name"] == NODE
        assert [d["name"] for d in published["spec"]["devices"]] == ["gpu-0", "gpu-1"]


def test_a_mode_change_waits_for_a_share_prepared_on_the_node(dirs, api, kubelet) -> None:
    """gpu-0 turns Exclusive while a share prepared here still runs, and its claim is already gone
    from the API: the checkpoint alone keeps the GPU published shareable."""
    api.create("Node", builders.node(NODE))
    claim = add_claim(
        api,
        "lim",
        [Alloc(share_id=SHARE_A, consumed={"memory": "1Gi", "cores": "5"})],
        [opaque(gpu_config("Limiter"))],
    )
    with running_plugin(dirs, api) as plugin:
        kubelet.register()
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        assert plugin.plugin.prepared_claims() == {"gpu-0": {"default/lim": True}}
    api.delete("ResourceClaim", "lim", "default")

    def published() -> dict[str, Any]:
        return {d["name"]: d for s in api.objects("ResourceSlice") for d in s["spec"]["devices"]}

    kubelet.close()
    with running_plugin(dirs, api, publish_slices=True, sharing="*=Exclusive"):
        wait_for(lambda: len(published()) == 2, what="both GPUs published")
        assert published()["gpu-0"].get("allowMultipleAllocations") is True
        assert published()["gpu-0"]["attributes"]["sharing"] == {"string": "Shared"}
        assert "allowMultipleAllocations" not in published()["gpu-1"]


def test_during_a_rolling_update_the_old_plugin_leaves_the_new_ones_sockets(dirs, api, kubelet) -> None:
    claim = add_claim(api, "c", [Alloc(device="gpu-1")])
    old = running_plugin(dirs, api)
    old.__enter__()
    kubelet.register()
    assert kubelet.prepare(claim)[uid_of(claim)].error == ""
    kubelet.close()
    with running_plugin(dirs, api):  # the new pod starts before the old one has stopped
        old.__exit__(None, None, None)
        assert dirs.registration_socket.exists() and dirs.service_socket.exists()
        kubelet.register()
        assert kubelet.prepare(claim)[uid_of(claim)].error == "", "the new plugin knows the old one's claims"
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
