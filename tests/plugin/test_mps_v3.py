"""MPS v3 on a 615 node: one server per GPU, a namespace per claim with server-side limits, clients
pointed at their namespace; a client with any other pipe directory is refused (driven through a fake
`nvidia-cuda-mps-control` that follows the documented namespace commands)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from fakes.fake_mps_control import ClientRefused, client_connect
from plugin_harness import gpu_config
from repo_paths import TESTS

from dra_gpu.config import parse_gpu_config
from dra_gpu.host.nvidia import NvidiaCommands
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import open_inventory
from dra_gpu.inventory.types import GpuInfo
from dra_gpu.plugin import sharing
from dra_gpu.plugin.sharing.modes.mps.common import CONTAINER_PIPE_DIR
from dra_gpu.plugin.sharing.modes.mps.namespaces import SERVER
from dra_gpu.plugin.sharing.plan import ClaimInfo, NodeContext, Plan, Share

GIB = 2**30
FAKE = TESTS / "fakes" / "fake_mps_control.py"
NEW = open_inventory("simulated:1xH100-80GB,driver=615.71.09", seed="new").gpus()[0]
OLD = open_inventory("simulated:1xH100-80GB", seed="old").gpus()[0]


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NodeContext:
    commands = SimulatedCommands(tmp_path / "gpus.json", control_program=str(FAKE))
    return NodeContext("gpu.dra-gpu.io", tmp_path / "state", tmp_path / "lib.so", tmp_path, commands)


def mps_share(gpu: GpuInfo, cores: int, memory: int) -> Share:
    return Share(
        position=0,
        request="gpu",
        pool="node",
        device="gpu-0",
        gpu=gpu,
        share_id=None,
        consumed={"memory": Fraction(memory), "cores": Fraction(cores)},
        admin_access=False,
        config=parse_gpu_config(gpu_config("MPS")),
    )


def prepare(node: NodeContext, uid: str, share: Share) -> Plan:
    plan = Plan(claim=ClaimInfo(uid, "default", uid), shares=[share], driver="gpu.dra-gpu.io")
    for backend in sharing.backends():
        backend.contribute(plan, node)
    handlers = sharing.hold_handlers()
    for hold in plan.holds:
        handlers[hold.kind].apply(hold, node)
    return plan


def unprepare(node: NodeContext, plan: Plan, last: bool) -> None:
    handlers = sharing.hold_handlers()
    for hold in reversed(plan.holds):
        handlers[hold.kind].release(hold, node, last=last or hold.kind != "mps-v3")


def pipe_mount(plan: Plan) -> Path:
    (mount,) = [m for m in plan.claim_edits.mounts if m.container_path == CONTAINER_PIPE_DIR]
    return Path(mount.host_path)


def exclusive(node: NodeContext) -> bool:
    assert isinstance(node.commands, SimulatedCommands)
    return node.commands.snapshot()["computeMode"].get(NEW.uuid) == "EXCLUSIVE_PROCESS"


def control(node: NodeContext, *args: str) -> str:
    pipe = node.state_dir / "mps-v3" / NEW.uuid / "pipe"
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(FAKE), *args], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_each_claim_gets_its_own_namespace_with_server_side_limits(node: NodeContext) -> None:
    a = prepare(node, "uid-a", mps_share(NEW, 30, 10 * GIB))
    b = prepare(node, "uid-b", mps_share(NEW, 50, 20 * GIB))
    assert exclusive(node)
    assert control(node, "server", "list") == SERVER  # one server for the GPU
    assert control(node, "namespace", "list", SERVER).split() == ["claim-uid-a", "claim-uid-b"]
    assert control(node, "namespace", "get", SERVER, "claim-uid-a", "active_thread_percentage") == "30"
    assert control(node, "namespace", "get", SERVER, "claim-uid-b", "pinned_memory_limit") == "20480M"
    # No client-side limits: the tenant cannot lift what the server enforces by editing its environment.
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in a.claim_edits.env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in a.claim_edits.env
    daemon_pipe = node.state_dir / "mps-v3" / NEW.uuid / "pipe"
    seen = client_connect(pipe_mount(a), daemon_pipe, exclusive(node))
    assert (seen["namespace"], seen["active_thread_percentage"], seen["pinned_memory_limit"]) == (
        "claim-uid-a",
        "30",
        "10240M",
    )
    assert client_connect(pipe_mount(b), daemon_pipe, exclusive(node))["namespace"] == "claim-uid-b"
    # The container sees only its namespace's directory, never the daemon's or the server's socket.
    assert pipe_mount(a) == daemon_pipe / SERVER / "claim-uid-a"


def test_a_client_with_a_wrong_pipe_directory_is_refused(node: NodeContext, tmp_path: Path) -> None:
    prepare(node, "uid-a", mps_share(NEW, 30, 10 * GIB))
    daemon_pipe = node.state_dir / "mps-v3" / NEW.uuid / "pipe"
    wrong = tmp_path / "default-tmp-nvidia-mps"  # e.g. CUDA_MPS_PIPE_DIRECTORY unset or edited
    wrong.mkdir()
    with pytest.raises(ClientRefused, match="busy or unavailable"):
        client_connect(wrong, daemon_pipe, exclusive(node))


def test_namespaces_go_with_their_claims_and_the_server_with_the_last(node: NodeContext) -> None:
    a = prepare(node, "uid-a", mps_share(NEW, 30, 10 * GIB))
    b = prepare(node, "uid-b", mps_share(NEW, 50, 20 * GIB))
    unprepare(node, b, last=False)
    assert control(node, "namespace", "list", SERVER).split() == ["claim-uid-a"]
    daemon_pipe = node.state_dir / "mps-v3" / NEW.uuid / "pipe"
    with pytest.raises(ClientRefused):
        client_connect(pipe_mount(b), daemon_pipe, exclusive(node))
    unprepare(node, a, last=True)
    assert not exclusive(node) and not daemon_pipe.exists()


def test_a_claim_without_capacity_gets_explicit_whole_gpu_limits(node: NodeContext) -> None:
    share = mps_share(NEW, 0, 0)
    share = Share(**{**share.__dict__, "consumed": {}})
    prepare(node, "uid-c", share)
    assert control(node, "namespace", "get", SERVER, "claim-uid-c", "active_thread_percentage") == "100"
    assert (
        control(node, "namespace", "get", SERVER, "claim-uid-c", "pinned_memory_limit")
        == f"{NEW.memory_bytes // 2**20}M"
    )


def test_old_driver_keeps_the_per_gpu_daemon_with_client_side_limits(node: NodeContext) -> None:
    plan = Plan(
        claim=ClaimInfo("uid-o", "default", "o"), shares=[mps_share(OLD, 30, GIB)], driver="gpu.dra-gpu.io"
    )
    for backend in sharing.backends():
        backend.contribute(plan, node)
    assert {h.kind for h in plan.holds} == {"mps"}
    assert plan.claim_edits.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"


def test_the_v3_daemon_is_started_outside_the_agent_like_the_v2_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cgroup = tmp_path / "mps-cgroup"
    commands = NvidiaCommands(
        nvidia_smi=shutil.which("true") or "/bin/true", mps_control=str(FAKE), mps_cgroup=cgroup, timeout_s=10
    )
    node = NodeContext("gpu.dra-gpu.io", tmp_path / "state", tmp_path / "lib.so", tmp_path, commands)
    plan = prepare(node, "uid-a", mps_share(NEW, 30, 10 * GIB))
    # Its launcher joined the MPS daemons' cgroup before it ran the control program.
    assert (cgroup / "cgroup.procs").read_text().strip().isdigit()
    assert control(node, "namespace", "list", SERVER).split() == ["claim-uid-a"]
    unprepare(node, plan, last=True)
    assert not (node.state_dir / "mps-v3" / NEW.uuid).exists()
