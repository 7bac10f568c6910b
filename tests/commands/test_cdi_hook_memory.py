"""The createRuntime hook sets the driver's memory limits on the container's own cgroup, teardown
clears them (also when the cgroup went first), and every case the driver or kernel cannot do is
refused with one line and a distinct exit status."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import fake_pynvml
from fakes.fake_cgroup import FakeCgroupTree

from dra_gpu.cli import main

GIB = 2**30
GPU_A, GPU_B = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"
BUS_A, BUS_B = "00000000:18:00.0", "00000000:2a:00.0"
REGION_A, REGION_B = f"nvidia/{BUS_A}", f"nvidia/{BUS_B}"
POD = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice"
LEAF = f"{POD}/cri-containerd-abc.scope"
PID = 4242


@pytest.fixture
def tree(tmp_path: Path) -> FakeCgroupTree:
    return FakeCgroupTree(tmp_path, regions=(REGION_A, REGION_B))


@pytest.fixture
def nvml(tree: FakeCgroupTree, monkeypatch: pytest.MonkeyPatch) -> Iterator[fake_pynvml.FakeDriver]:
    driver = fake_pynvml.FakeDriver(
        gpus=[
            fake_pynvml.FakeGpu(uuid=GPU_A, pci_bus_id=BUS_A),
            fake_pynvml.FakeGpu(uuid=GPU_B, pci_bus_id=BUS_B),
        ],
        driver_version="615.71.09",
    )
    fake_pynvml.install(driver)
    monkeypatch.setattr(
        fake_pynvml, "memory_limits", fake_pynvml.MemoryLimitState(cgroup_root=str(tree.root))
    )
    monkeypatch.setenv("DRA_GPU_NVML_MODULE", "fakes.fake_pynvml")
    yield driver
    fake_pynvml.install(None)


def hook(
    monkeypatch: pytest.MonkeyPatch,
    tree: FakeCgroupTree,
    records: Path,
    name: str,
    *limits: str,
    cid: str = "abc",
) -> int:
    state = {"ociVersion": "1.2.0", "id": cid, "status": "creating", "pid": PID, "bundle": "/run/b"}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(state)))
    args = ["cdi-hook", name, "--record-dir", str(records), "--cgroup-root", str(tree.root)]
    args += ["--proc-root", str(tree.proc)]
    for limit in limits:
        args += ["--limit", limit]
    return main(args)


def test_limits_land_on_the_containers_leaf_and_the_soft_limit_on_its_ancestors(
    tree: FakeCgroupTree, nvml: fake_pynvml.FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_process(PID, LEAF)
    tree.mkdir(f"{POD}/cri-containerd-sibling.scope")
    records = tmp_path / "records"
    assert hook(monkeypatch, tree, records, "set-memory-limits", f"{GPU_A}={4 * GIB}:{8 * GIB}") == 0
    assert tree.read(LEAF, "dmem.max")[REGION_A] == str(8 * GIB)
    assert tree.read(LEAF, "dmem.min")[REGION_A] == str(4 * GIB)
    assert tree.read(LEAF, "dmem.max")[REGION_B] == "max"  # the container's other GPU is not touched
    assert tree.read(POD, "dmem.min")[REGION_A] == str(4 * GIB)  # the kernel's propagation
    assert tree.read(POD, "dmem.max")[REGION_A] == "max"  # the hard limit is the leaf's alone
    assert tree.read(f"{POD}/cri-containerd-sibling.scope", "dmem.max")[REGION_A] == "max"
    record = json.loads((records / "abc.json").read_text())
    assert record["cgroup"] == str(tree.root / LEAF) and record["gpus"][GPU_A]["regions"] == [REGION_A]

    assert hook(monkeypatch, tree, records, "clear-memory-limits") == 0
    assert tree.read(LEAF, "dmem.min")[REGION_A] == "0" and tree.read(LEAF, "dmem.max")[REGION_A] == "max"
    assert tree.read(POD, "dmem.min")[REGION_A] == "0"  # nothing leaks into the ancestors
    assert not (records / "abc.json").exists()


def test_teardown_after_the_cgroup_went_takes_the_reservation_back_from_the_ancestors(
    tree: FakeCgroupTree, nvml: fake_pynvml.FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_process(PID, LEAF)
    records = tmp_path / "records"
    limits = (f"{GPU_A}={2 * GIB}:{6 * GIB}", f"{GPU_B}={3 * GIB}:{3 * GIB}")
    assert hook(monkeypatch, tree, records, "set-memory-limits", *limits) == 0
    assert tree.read(POD, "dmem.min") == {REGION_A: str(2 * GIB), REGION_B: str(3 * GIB)}
    tree.remove(LEAF)  # the runtime removed the cgroup before the poststop hook ran
    assert tree.read(POD, "dmem.min") == {REGION_A: str(2 * GIB), REGION_B: str(3 * GIB)}  # the leak
    assert hook(monkeypatch, tree, records, "clear-memory-limits") == 0
    assert tree.read(POD, "dmem.min") == {REGION_A: "0", REGION_B: "0"}
    assert tree.read("kubepods.slice", "dmem.min") == {REGION_A: "0", REGION_B: "0"}


def test_without_dmem_the_driver_internal_accounting_takes_the_limit(
    tmp_path: Path, nvml: fake_pynvml.FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = FakeCgroupTree(tmp_path / "misc", dmem=False)
    fake_pynvml.memory_limits.backend = "misc"
    tree.add_process(PID, LEAF)
    assert hook(monkeypatch, tree, tmp_path / "r", "set-memory-limits", f"{GPU_A}={GIB}:{2 * GIB}") == 0
    assert fake_pynvml.memory_limits.limits == {(GPU_A, str(tree.root / LEAF)): (GIB, 2 * GIB)}
    assert hook(monkeypatch, tree, tmp_path / "r", "clear-memory-limits") == 0
    assert fake_pynvml.memory_limits.limits == {}


@pytest.mark.parametrize(
    ("setup", "code", "message"),
    [
        ("old-driver", 4, "needs release 615 or later"),
        ("unprivileged", 4, "needs root"),
        ("mig", 4, "NVML_ERROR_NOT_SUPPORTED"),
        ("no-dmem-delegation", 4, "no dmem/misc memory accounting"),
        ("cgroup-v1", 3, "cgroup v1 only"),
        ("no-cgroup", 3, "is not a cgroup-v2 directory"),
        ("too-big", 4, "NVML_ERROR_INVALID_ARGUMENT"),
    ],
)
def test_what_the_driver_or_kernel_cannot_do_is_refused_with_one_line(
    setup: str,
    code: int,
    message: str,
    tree: FakeCgroupTree,
    nvml: fake_pynvml.FakeDriver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hard = 8 * GIB
    if setup == "cgroup-v1":
        tree.add_v1_process(PID)
    else:
        leaf = tree.add_process(PID, LEAF)
    if setup == "old-driver":
        nvml.driver_version = "580.95.05"
    elif setup == "unprivileged":
        fake_pynvml.memory_limits.privileged = False
    elif setup == "mig":
        nvml.gpus[0].mig_mode = (fake_pynvml.NVML_DEVICE_MIG_ENABLE, fake_pynvml.NVML_DEVICE_MIG_ENABLE)
    elif setup == "no-dmem-delegation":
        (leaf / "dmem.max").unlink()
    elif setup == "no-cgroup":
        (leaf / "cgroup.controllers").unlink()
    elif setup == "too-big":
        hard = 200 * GIB
    records = tmp_path / "records"
    assert hook(monkeypatch, tree, records, "set-memory-limits", f"{GPU_A}={GIB}:{hard}") == code
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and message in err
        and err.startswith("dra-gpu cdi-hook set-memory-limits:")
    )
    assert not list(records.glob("*.json")) if records.exists() else True


def test_a_failure_on_the_second_gpu_undoes_the_first(
    tree: FakeCgroupTree, nvml: fake_pynvml.FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_process(PID, LEAF)
    nvml.gpus[1].mig_mode = (fake_pynvml.NVML_DEVICE_MIG_ENABLE, fake_pynvml.NVML_DEVICE_MIG_ENABLE)
    limits = (f"{GPU_A}={GIB}:{2 * GIB}", f"{GPU_B}={GIB}:{2 * GIB}")
    assert hook(monkeypatch, tree, tmp_path / "r", "set-memory-limits", *limits) == 4
    assert tree.read(LEAF, "dmem.max")[REGION_A] == "max" and tree.read(POD, "dmem.min")[REGION_A] == "0"
    assert not list((tmp_path / "r").glob("*.json"))


def test_bad_input_exits_2(
    tree: FakeCgroupTree,
    nvml: fake_pynvml.FakeDriver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("not json"))
    args = ["cdi-hook", "set-memory-limits", "--record-dir", str(tmp_path), "--limit", f"{GPU_A}=1:2"]
    assert main(args) == 2
    assert "OCI state on stdin is not JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["cdi-hook", "set-memory-limits", "--record-dir", str(tmp_path), "--limit", f"{GPU_A}=9:2"])
    assert exit_info.value.code == 2
    assert "soft limit 9 is above the hard limit 2" in capsys.readouterr().err
