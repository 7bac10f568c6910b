"""The driver-memory backend: on a 615 node a Limiter share's request and limit become a createRuntime
hook on the claim's device (soft = request, hard = limit) with a poststop clear; unprepare clears
what a poststop hook left; an old node gets no hook; a limit below the request is refused."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
from fakes import fake_pynvml
from fakes.fake_cgroup import FakeCgroupTree
from plugin_harness import gpu_config

from cdi.validation import spec_problems
from dra_gpu.cli import main
from dra_gpu.config import parse_gpu_config
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import open_inventory
from dra_gpu.plugin import sharing
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing.plan import ClaimInfo, NodeContext, Plan, Share

GIB = 2**30
NEW = open_inventory("simulated:1xH100-80GB,driver=615.71.09", seed="new").gpus()[0]
OLD = open_inventory("simulated:1xH100-80GB", seed="old").gpus()[0]


def share(gpu: object, memory: int = GIB, **limiter: object) -> Share:
    return Share(
        position=0,
        request="gpu",
        pool="node",
        device="gpu-0",
        gpu=gpu,  # type: ignore[arg-type]
        share_id="00000000-0000-4000-8000-000000000001",
        consumed={"memory": Fraction(memory), "cores": Fraction(10)},
        admin_access=False,
        config=parse_gpu_config(gpu_config("Limiter", limiter=limiter) if limiter else gpu_config("Limiter")),
    )


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NodeContext:
    library = tmp_path / "lib.so"
    library.write_text("")
    # The host's root as the agent sees it, with the hook's executable (and the toolkit's) installed.
    host = tmp_path / "driver-root"
    for name in ("usr/local/bin/dra-gpu", "usr/bin/nvidia-cdi-hook"):
        (host / name).parent.mkdir(parents=True, exist_ok=True)
        (host / name).write_text("#!/bin/sh\n")
        (host / name).chmod(0o755)
    monkeypatch.setenv("DRA_GPU_CDI_HOOK_PATH", "/usr/local/bin/dra-gpu")
    return NodeContext(
        "gpu.dra-gpu.io",
        tmp_path / "state",
        library,
        tmp_path,
        SimulatedCommands(),
        driver_root=host,
        driver_root_host_path=Path("/"),
    )


def plan_for(node: NodeContext, *shares: Share) -> Plan:
    plan = Plan(claim=ClaimInfo("uid-1", "default", "c"), shares=list(shares), driver="gpu.dra-gpu.io")
    for backend in sharing.backends():
        backend.contribute(plan, node)
    return plan


def test_new_node_gets_the_hook_with_request_as_soft_and_limit_as_hard(node: NodeContext) -> None:
    plan = plan_for(node, share(NEW, 2 * GIB, memoryLimit="6Gi"))
    spec = plan.cdi_spec()
    assert spec_problems(spec.with_version()) == []
    hooks = spec.devices[0].container_edits.hooks or []
    assert [h.hook_name for h in hooks] == ["createRuntime", "poststop"]
    create = hooks[0]
    assert create.path == "/usr/local/bin/dra-gpu"
    assert create.args is not None and create.args[:3] == ["dra-gpu", "cdi-hook", "set-memory-limits"]
    assert f"{NEW.uuid}={2 * GIB}:{6 * GIB}" in create.args
    assert [h.kind for h in plan.holds if h.kind == "memory-limits"] == ["memory-limits"]
    # The limiter keeps the claim-wide pooled budget, at the ceiling.
    assert plan.limits[NEW.uuid].memory == 6 * GIB


def test_old_node_gets_no_hook_only_the_limiter(node: NodeContext) -> None:
    plan = plan_for(node, share(OLD, 2 * GIB, memoryLimit="6Gi"))
    assert not plan.cdi_spec().devices[0].container_edits.hooks
    assert plan.limits[OLD.uuid].memory == 6 * GIB
    assert "/etc/ld.so.preload" in [m.container_path for m in plan.claim_edits.mounts]


def test_limit_below_the_request_is_refused_with_what_to_change(node: NodeContext) -> None:
    with pytest.raises(
        PrepareError, match=r"memoryLimit 1Gi is below the claim's memory request 4Gi; set memoryLimit"
    ):
        plan_for(node, share(NEW, 4 * GIB, memoryLimit="1Gi"))


def test_toolkit_hook_is_used_when_asked_for(node: NodeContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_MEMORY_LIMIT_HOOK", "toolkit")
    monkeypatch.setenv("DRA_GPU_NVIDIA_CDI_HOOK", "/usr/bin/nvidia-cdi-hook")
    edits = plan_for(node, share(NEW, 2 * GIB, memoryLimit="3Gi")).cdi_spec().devices[0].container_edits
    assert edits.env is not None and "NVIDIA_GPU_MEMORY_REQUEST=2048" in edits.env
    assert "NVIDIA_GPU_MEMORY_LIMIT=3072" in edits.env
    assert edits.hooks is not None and edits.hooks[0].args == ["nvidia-cdi-hook", "apply-cuda-memory-limits"]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    driver = fake_pynvml.FakeDriver(
        gpus=[fake_pynvml.FakeGpu(uuid=NEW.uuid, pci_bus_id=NEW.pci_bus_id)], driver_version="615.71.09"
    )
    fake_pynvml.install(driver)
    monkeypatch.setenv("DRA_GPU_NVML_MODULE", "fakes.fake_pynvml")
    yield
    fake_pynvml.install(None)


def test_unprepare_clears_the_limits_a_poststop_hook_did_not(
    node: NodeContext, tmp_path: Path, fake_nvml: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    region = f"nvidia/{NEW.pci_bus_id}"
    tree = FakeCgroupTree(tmp_path / "cg", regions=(region,))
    monkeypatch.setattr(
        fake_pynvml, "memory_limits", fake_pynvml.MemoryLimitState(cgroup_root=str(tree.root))
    )
    plan = plan_for(node, share(NEW, 2 * GIB, memoryLimit="4Gi"))
    handlers = sharing.hold_handlers()
    (hold,) = [h for h in plan.holds if h.kind == "memory-limits"]
    handlers[hold.kind].apply(hold, node)
    leaf = "kubepods.slice/pod1/ctr1"
    tree.add_process(77, leaf)
    create = (plan.cdi_spec().devices[0].container_edits.hooks or [])[0]
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"id": "ctr1", "pid": 77, "status": "creating"})))
    args = [*(create.args or [])[1:], "--cgroup-root", str(tree.root), "--proc-root", str(tree.proc)]
    assert main(args) == 0
    assert tree.read(leaf, "dmem.max")[region] == str(4 * GIB)
    assert tree.read("kubepods.slice", "dmem.min")[region] == str(2 * GIB)
    # The poststop hook never ran (the node agent restarted, the runtime was killed): unprepare clears.
    handlers[hold.kind].release(hold, node, last=True)
    assert tree.read(leaf, "dmem.max")[region] == "max"
    assert tree.read("kubepods.slice", "dmem.min")[region] == "0"
    assert not Path(str(hold.params["dir"])).exists()


def test_every_hold_of_a_plan_on_a_driver_node_has_a_handler_to_undo_it(node: NodeContext) -> None:
    plan = plan_for(node, replace(share(NEW, GIB), position=0))
    assert {h.kind for h in plan.holds} <= set(sharing.hold_handlers())
