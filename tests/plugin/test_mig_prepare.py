"""Preparing MIG devices through the real gRPC agent: static instances (device nodes, capability
nodes, the MIG UUID), dynamic placements (the instance made at prepare and destroyed at unprepare,
crash-safe, an admin's instance never touched) and a static instance shared with the limiter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from plugin_harness import (
    NODE,
    Alloc,
    Kubelet,
    PluginDirs,
    add_claim,
    cdi_ids,
    gpu_config,
    opaque,
    resolve,
    running_plugin,
    share_claim,
    uid_of,
)

from cdi.resolver import ContainerConfig
from dra_gpu.devicekinds.mig_instances import STORE_NAME
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import GpuInfo, SimulatedInventory
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.inventory.mig_profiles import MIG_TABLES
from dra_gpu.kube import ApiError
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.sharing.modes.limiter import container_claim_dir
from dra_gpu.plugin.sharing.plan import ClaimInfo

STATIC = "1xH100-80GB:mig=1g.10gb*7"
DYNAMIC = "1xH100-80GB:mig"
H100 = MIG_TABLES["H100-80GB"]
COMMON = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}


def cap(gpu_minor: int, gi: int, ci: int | None = None) -> str:
    """The driver's numbering in mig-minors: config 1, monitor 2, then per GPU 15 GIs of 1 + 8 CI entries."""
    minor = 3 + gpu_minor * 135 + gi * 9 + (0 if ci is None else 1 + ci)
    return f"/dev/nvidia-caps/nvidia-cap{minor}"


def host_nodes(dirs: PluginDirs) -> None:
    dirs.make_device_nodes((0,))
    caps = dirs.dev_root / "dev" / "nvidia-caps"
    caps.mkdir(parents=True)
    for minor in range(1, 200):
        (caps / f"nvidia-cap{minor}").write_text("")


def info(claim: dict[str, Any]) -> ClaimInfo:
    return ClaimInfo(uid=uid_of(claim), namespace="default", name=claim["metadata"]["name"])


def instances(commands: SimulatedCommands, gpu: GpuInfo) -> list[tuple[str, int]]:
    return [(i.profile, i.start) for i in commands.mig_instances(gpu)]


def test_a_static_mig_claim_gets_the_parent_node_its_capability_nodes_and_its_uuid(
    dirs, api, kubelet
) -> None:
    host_nodes(dirs)
    inventory = SimulatedInventory(STATIC, seed=NODE)
    (gpu,) = inventory.gpus()
    third = gpu.mig_instances[2]
    claim = add_claim(api, "mig", [Alloc(device="gpu-0-mig-1g10gb-2")], [opaque(gpu_config("Exclusive"))])
    commands = SimulatedCommands(state_file=dirs.simulated_state)
    with running_plugin(dirs, api, inventory=inventory, commands=commands):
        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert response.error == ""
        container = resolve(dirs, cdi_ids(response))
        nodes = {n.path for n in container.device_nodes}
        assert nodes == {"/dev/nvidia0", cap(0, third.gi_id), cap(0, third.gi_id, third.ci_id), *COMMON}
        assert container.env["DRAGPU_DEVICE_GPU_0_MIG_1G10GB_2"] == third.uuid
        assert third.uuid.startswith("MIG-") and container.env["NVIDIA_VISIBLE_DEVICES"] == "void"

        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert dirs.spec_files() == []
    assert not [c for c in commands.calls if c[0].endswith("mig_instance")], "a static instance is left alone"


def test_a_toolkit_spec_naming_the_parent_gpu_is_not_used_for_a_mig_device(dirs, api, kubelet) -> None:
    host_nodes(dirs)
    inventory = SimulatedInventory(STATIC, seed=NODE)
    (dirs.ctk_dir / "nvidia.yaml").write_text(
        'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n'
        '- name: "0"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n'
    )
    claim = add_claim(api, "mig", [Alloc(device="gpu-0-mig-1g10gb-0")])
    with running_plugin(dirs, api, inventory=inventory):
        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert response.error == ""
        assert not [i for i in cdi_ids(response) if i.startswith("nvidia.com/gpu=")], "the whole GPU"


def two_shares(api: FakeKube, strategy: str) -> list[dict[str, Any]]:
    """Claims `a` and `b`, each a share of 4 GiB and 40 % of the first 1g.10gb instance, in `strategy`."""
    return [
        add_claim(
            api,
            name,
            [Alloc(device="gpu-0-mig-1g10gb-0", share_id=share, consumed={"memory": "4Gi", "cores": "40"})],
            [opaque(gpu_config(strategy))],
        )
        for name, share in (
            ("a", "0f6e3a4e-5d2c-4b8a-9d55-1c0e7f3a9b01"),
            ("b", "7a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d"),
        )
    ]


def prepared(dirs: PluginDirs, kubelet: Kubelet, claims: list[dict[str, Any]]) -> list[ContainerConfig]:
    """`claims` prepared in one call, each without an error: what a container of each gets."""
    answers = kubelet.prepare(*claims)
    assert [answers[uid_of(c)].error for c in claims] == [""] * len(claims)
    return [resolve(dirs, cdi_ids(answers[uid_of(c)])) for c in claims]


def test_a_static_mig_instance_shared_with_the_limiter_is_limited_by_its_mig_uuid(dirs, api, kubelet) -> None:
    host_nodes(dirs)
    inventory = SimulatedInventory(STATIC, seed=NODE)
    first = inventory.gpus()[0].mig_instances[0]
    claims = two_shares(api, "Limiter")
    with running_plugin(dirs, api, inventory=inventory):
        kubelet.register()
        for claim, container in zip(claims, prepared(dirs, kubelet, claims), strict=True):
            limits = container.mount_for(f"{container_claim_dir(uid_of(claim))}/limits")
            assert limits is not None
            assert Path(limits.host_path).read_text().splitlines()[-1] == (
                f"device={first.uuid} memory={4 << 30} cores=40"
            )
            assert cap(0, first.gi_id) in {n.path for n in container.device_nodes}
        # A third share past the instance's memory (not the GPU's) is refused.
        third = share_claim(api, "c", device="gpu-0-mig-1g10gb-0", share=3, memory="4Gi", cores="10")
        error = kubelet.prepare(third)[uid_of(third)].error
        assert "more than the GPU has" in error and first.uuid in error


# -- dynamic MIG -------------------------------------------------------------------------------------------
@pytest.fixture
def dynamic(dirs: PluginDirs) -> tuple[SimulatedInventory, SimulatedCommands, GpuInfo]:
    host_nodes(dirs)
    inventory = SimulatedInventory(DYNAMIC, seed=NODE)
    return inventory, SimulatedCommands(state_file=dirs.simulated_state), inventory.gpus()[0]


def mig_claim(api: FakeKube, name: str = "mig", device: str = "gpu-0-mig-3g40gb-4") -> dict[str, Any]:
    return add_claim(api, name, [Alloc(device=device)], [opaque(gpu_config("Exclusive"))])


def test_a_dynamic_placement_is_created_at_prepare_and_destroyed_at_unprepare(
    dirs, api, kubelet, dynamic
) -> None:
    inventory, commands, gpu = dynamic
    claim = mig_claim(api)
    with running_plugin(dirs, api, inventory=inventory, commands=commands):
        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert response.error == ""
        (made,) = commands.mig_instances(gpu)
        assert (made.profile, made.start) == ("3g.40gb", 4)
        container = resolve(dirs, cdi_ids(response))
        assert container.env["DRAGPU_DEVICE_GPU_0_MIG_3G40GB_4"] == made.uuid
        assert {"/dev/nvidia0", cap(0, made.gi_id), cap(0, made.gi_id, made.ci_id)} <= {
            n.path for n in container.device_nodes
        }
        # A repeated prepare (the kubelet retries) neither makes a second instance nor changes the UUID.
        assert list(cdi_ids(kubelet.prepare(claim)[uid_of(claim)])) == list(cdi_ids(response))
        assert commands.mig_instances(gpu) == [made]

        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert commands.mig_instances(gpu) == []
        assert dirs.spec_files() == []


def test_an_instance_in_use_is_not_destroyed_and_unprepare_says_so(dirs, api, kubelet, dynamic) -> None:
    inventory, commands, gpu = dynamic
    claim = mig_claim(api)
    with running_plugin(dirs, api, inventory=inventory, commands=commands):
        kubelet.register()
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        (made,) = commands.mig_instances(gpu)
        commands.set_mig_in_use(made.uuid, True)
        error = kubelet.unprepare(claim)[uid_of(claim)]
        assert "in use" in error and "stop the processes" in error
        assert commands.mig_instances(gpu) == [made]
        commands.set_mig_in_use(made.uuid, False)
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert commands.mig_instances(gpu) == []


def test_an_admins_instance_is_never_touched(dirs, api, kubelet, dynamic) -> None:
    inventory, commands, gpu = dynamic
    profile = H100.find("1g.10gb")
    assert profile is not None
    admins = commands.create_mig_instance(gpu, profile, 0)
    overlapping = mig_claim(api, "overlap", "gpu-0-mig-4g40gb-0")
    fits = mig_claim(api, "fits")
    with running_plugin(dirs, api, inventory=inventory, commands=commands):
        kubelet.register()
        error = kubelet.prepare(overlapping)[uid_of(overlapping)].error
        assert "overlaps instance" in error and admins.uuid in error
        assert kubelet.prepare(fits)[uid_of(fits)].error == ""
        assert kubelet.unprepare(fits, overlapping) == {uid_of(fits): "", uid_of(overlapping): ""}
    with running_plugin(dirs, api, inventory=inventory, commands=commands):  # a restart reconciles
        pass
    assert commands.mig_instances(gpu) == [admins]
    assert (dirs.state_dir / STORE_NAME).read_text() == '{"instances": []}'


class Crash(BaseException):
    """Escapes every `except Exception`, as a kill does."""


def crash_at(step: str) -> Any:
    def hook(reached: str) -> None:
        if reached == step:
            raise Crash(step)

    return hook


@pytest.mark.parametrize("step", ["prepare:mig-recorded", "prepare:mig-created"])
def test_killed_around_the_create_then_the_claim_deleted_leaves_no_instance(dirs, api, dynamic, step) -> None:
    inventory, commands, gpu = dynamic
    claim = mig_claim(api)
    crash = crash_at(step)
    with (
        running_plugin(dirs, api, inventory=inventory, commands=commands, fault_hook=crash) as plugin,
        pytest.raises(Crash),
    ):
        plugin.plugin.preparer.prepare([info(claim)])
    assert len(commands.mig_instances(gpu)) == (step == "prepare:mig-created")
    api.delete("ResourceClaim", "mig", "default")
    with running_plugin(dirs, api, inventory=inventory, commands=commands):
        assert commands.mig_instances(gpu) == [], "the restarted agent destroys what it made"
    assert json.loads((dirs.state_dir / STORE_NAME).read_text()) == {"instances": []}


def test_killed_after_the_create_then_retried_adopts_the_instance(dirs, api, kubelet, dynamic) -> None:
    inventory, commands, gpu = dynamic
    claim = mig_claim(api)
    crash = crash_at("prepare:mig-created")
    with (
        running_plugin(dirs, api, inventory=inventory, commands=commands, fault_hook=crash) as plugin,
        pytest.raises(Crash),
    ):
        plugin.plugin.preparer.prepare([info(claim)])
    (made,) = commands.mig_instances(gpu)
    # The claim still exists: the restarted agent keeps the instance and the kubelet's retry adopts it.
    with running_plugin(dirs, api, inventory=inventory, commands=commands) as plugin:
        assert plugin.plugin.preparer.prepare([info(claim)])[uid_of(claim)].error == ""
        assert commands.mig_instances(gpu) == [made]
        assert plugin.plugin.preparer.unprepare([info(claim)]) == {uid_of(claim): ""}
    assert commands.mig_instances(gpu) == []


@pytest.mark.parametrize("strategy", ["TimeSlicing", "MPS"])
def test_a_static_mig_instance_is_shared_by_time_slicing_or_mps(dirs, api, kubelet, strategy: str) -> None:
    """Two claims share one instance; MPS runs a daemon for the instance alone (its `MIG-` UUID) and leaves the
    GPU's compute mode, which would apply to every instance, as it is."""
    host_nodes(dirs)
    inventory = SimulatedInventory(STATIC, seed=NODE)
    first = inventory.gpus()[0].mig_instances[0]
    commands = SimulatedCommands(state_file=dirs.simulated_state)
    claims = two_shares(api, strategy)
    with running_plugin(dirs, api, inventory=inventory, commands=commands):
        kubelet.register()
        for container in prepared(dirs, kubelet, claims):
            assert {cap(0, first.gi_id), cap(0, first.gi_id, first.ci_id)} <= {
                n.path for n in container.device_nodes
            }
            assert first.uuid in container.env.values()
            if strategy == "MPS":
                assert container.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
        started = [c for c in commands.calls if c[0] == "start_mps_daemon"]
        assert [c[1] for c in started] == ([first.uuid] if strategy == "MPS" else [])
        assert not [c for c in commands.calls if c[0] == "set_compute_mode"]
        assert all(not error for error in kubelet.unprepare(*claims).values())


def power_cycle(dirs: PluginDirs) -> None:
    """A reboot of the simulated node: the GPUs' dynamic MIG instances are gone (UUIDs are not reused)."""
    state = json.loads(dirs.simulated_state.read_text())
    state["mig"] = {}
    state["migInUse"] = {}
    dirs.simulated_state.write_text(json.dumps(state))


def prepared_then_power_cycled(
    dirs: PluginDirs,
    api: FakeKube,
    kubelet: Kubelet,
    dynamic: tuple[SimulatedInventory, SimulatedCommands, GpuInfo],
) -> tuple[dict[str, Any], MigInstance]:
    """A dynamic MIG claim prepared, then the node power-cycled (its instance gone): the claim, and the
    instance it had."""
    inventory, commands, gpu = dynamic
    claim = mig_claim(api)
    with running_plugin(dirs, api, inventory=inventory, commands=commands):
        kubelet.register()
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        (before,) = commands.mig_instances(gpu)
    kubelet.close()
    power_cycle(dirs)
    return claim, before


def test_after_a_reboot_the_kubelets_re_prepare_makes_the_dynamic_instance_again(
    dirs, api, kubelet, dynamic
) -> None:
    inventory, commands, gpu = dynamic
    claim, before = prepared_then_power_cycled(dirs, api, kubelet, dynamic)
    with running_plugin(dirs, api, inventory=inventory, commands=commands, boot_id="boot-2"):
        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert response.error == ""
        (made,) = commands.mig_instances(gpu)
        assert (made.profile, made.start) == ("3g.40gb", 4) and made.uuid != before.uuid
        container = resolve(dirs, cdi_ids(response))
        assert container.env["DRAGPU_DEVICE_GPU_0_MIG_3G40GB_4"] == made.uuid, "the spec names the new one"
        assert {cap(0, made.gi_id), cap(0, made.gi_id, made.ci_id)} <= {
            n.path for n in container.device_nodes
        }
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert commands.mig_instances(gpu) == [] and dirs.spec_files() == []


class NoApi(FakeKube):
    """An API server that does not answer."""

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        raise ApiError("connection refused")

    def list(self, kind: str, *args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        raise ApiError("connection refused")


def test_after_a_reboot_without_the_api_the_re_prepare_refuses_with_the_reason(
    dirs, api, kubelet, dynamic
) -> None:
    inventory, commands, gpu = dynamic
    claim, _ = prepared_then_power_cycled(dirs, api, kubelet, dynamic)
    with running_plugin(dirs, NoApi(), inventory=inventory, commands=commands, boot_id="boot-2"):
        kubelet.register()
        error = kubelet.prepare(claim)[uid_of(claim)].error
        assert "MIG instance" in error and "lost" in error and "connection refused" in error, error
        assert commands.mig_instances(gpu) == [] and dirs.spec_files() == []
