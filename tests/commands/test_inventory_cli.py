"""`dra-gpu gpus` as a user runs it: formats, the environment variable, and failures without tracebacks."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from fakes import fake_pynvml
from fakes.fake_pynvml import FakeDriver, FakeGpu

from dra_gpu.cli import main
from dra_gpu.inventory import KNOWN_MODELS, SimulatedInventory

CAMEL_KEYS = {
    "memoryIsolation",
    "memoryLimitBackend",
    "mpsNamespaces",
    "isolationReason",
    "index",
    "minor",
    "uuid",
    "productName",
    "architecture",
    "cudaComputeCapability",
    "memoryBytes",
    "driverVersion",
    "cudaDriverVersion",
    "pciBusId",
    "migCapable",
    "migEnabled",
    "migDynamic",
    "migInstances",
    "healthy",
    "healthReason",
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags read these variables; a developer's shell must not change what the tests see."""
    monkeypatch.delenv("DRA_GPU_SIMULATE", raising=False)
    monkeypatch.delenv("DRA_GPU_NODE_NAME", raising=False)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A machine without the NVIDIA driver: pynvml imports, nvmlInit cannot find the library."""
    fake_pynvml.install(None)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    yield


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    assert main(["gpus", *argv, "-o", "json"]) == 0
    data: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return data


def test_json_lists_the_simulated_gpus_with_camel_case_keys(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--simulate", "2xH100-80GB,1xL4-24GB")
    assert [set(item) for item in data] == [CAMEL_KEYS] * 3
    expected = SimulatedInventory("2xH100-80GB,1xL4-24GB").gpus()
    assert [item["uuid"] for item in data] == [gpu.uuid for gpu in expected]
    assert data[2]["productName"] == KNOWN_MODELS["L4-24GB"].product_name
    assert data[0]["memoryBytes"] == KNOWN_MODELS["H100-80GB"].memory_bytes
    assert data[0]["migCapable"] is True and data[2]["migCapable"] is False


def test_node_name_gives_that_nodes_uuids(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "--simulate", "1xH100-80GB", "--node-name", "gpu-node-7")
    assert data[0]["uuid"] == SimulatedInventory("1xH100-80GB", seed="gpu-node-7").gpus()[0].uuid
    other = run_json(capsys, "--simulate", "1xH100-80GB", "--node-name", "gpu-node-8")
    assert other[0]["uuid"] != data[0]["uuid"]


def test_table_is_readable_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--simulate", "1xH100-80GB,1xT4-16GB"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["INDEX", "UUID", "PRODUCT"]
    h100 = KNOWN_MODELS["H100-80GB"]
    assert lines[1].startswith("0 ") and h100.product_name in lines[1] and "Hopper" in lines[1]
    assert f"{h100.memory_bytes // 2**20}Mi" in lines[1], "memory as a Kubernetes quantity"
    assert "Tesla T4" in lines[2] and "Turing" in lines[2]
    # Columns line up: each row's UUID starts where the header's UUID column does.
    column = lines[0].index("UUID")
    assert lines[1][column:].startswith("GPU-") and lines[2][column:].startswith("GPU-")
    assert "2 GPU(s), backend simulated" in out


def test_environment_variable_selects_the_simulated_backend(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_gpu: None
) -> None:
    monkeypatch.setenv("DRA_GPU_SIMULATE", "3xA100-80GB")
    data = run_json(capsys)
    assert [item["productName"] for item in data] == [KNOWN_MODELS["A100-80GB"].product_name] * 3


def test_without_a_gpu_says_so_and_suggests_simulation(
    no_gpu: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gpus"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("NVML is not available: ")
    assert "use --simulate PROFILE" in captured.err
    assert "Traceback" not in captured.err


def test_bad_profile_exits_2_naming_the_bad_part(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--simulate", "2xH100-80GB,3xFOO"]) == 2
    err = capsys.readouterr().err
    assert "'3xFOO'" in err and "unknown GPU model 'FOO'" in err and "H100-80GB" in err
    assert "Traceback" not in err


def test_real_backend_through_nvml(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    machine = FakeDriver(gpus=[FakeGpu(uuid="GPU-11111111-2222-3333-4444-555555555555")])
    fake_pynvml.install(machine)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    try:
        data = run_json(capsys)
    finally:
        fake_pynvml.install(None)
    assert [item["uuid"] for item in data] == ["GPU-11111111-2222-3333-4444-555555555555"]
    assert data[0]["pciBusId"] == "0000:18:00.0"
    assert machine.refcount == 0, "the command releases NVML before it exits"


def test_mig_column_says_enabled_capable_or_dash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "yes" read as "MIG is on" when it meant the GPU could have it."""
    on, off = (fake_pynvml.NVML_DEVICE_MIG_ENABLE,) * 2, (fake_pynvml.NVML_DEVICE_MIG_DISABLE,) * 2
    machine = FakeDriver(
        gpus=[
            FakeGpu(uuid="GPU-00000000-0000-0000-0000-000000000000", mig_mode=on),
            FakeGpu(uuid="GPU-11111111-1111-1111-1111-111111111111", mig_mode=off),
            FakeGpu(uuid="GPU-22222222-2222-2222-2222-222222222222", mig_mode=None),
        ]
    )
    fake_pynvml.install(machine)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    try:
        assert main(["gpus"]) == 0
    finally:
        fake_pynvml.install(None)
    lines = capsys.readouterr().out.splitlines()
    column = lines[0].index("MIG")
    assert [line[column:].split()[0] for line in lines[1:4]] == ["enabled", "capable", "-"]
