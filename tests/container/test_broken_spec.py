"""The pre-flight gate every container test passes through: broken specs are named before podman runs,
and the specs the plugin writes for simulated GPUs pass it.

No podman and no root needed: these run everywhere, and before any container starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from container_node import Limiter, plugin_node
from container_support import SpecRefused, preflight, specs_providing
from plugin_harness import Alloc, gpu_config

from cdi.files import read_spec
from cdi.version import minimum_version

KIND = "k8s.gpu.dra-gpu.io/claim"


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A fake host root: a FIFO stands in for a device node (creating a real one needs mknod)."""
    root = tmp_path / "host"
    (root / "dev").mkdir(parents=True)
    os.mkfifo(root / "dev" / "nvidiactl")
    (root / "lib").mkdir()
    (root / "lib" / "libdragpu-limiter.so.1").write_text("")
    return root


def _write(cdi_dir: Path, name: str, version: str, **edits: Any) -> Path:
    spec = {
        "cdiVersion": version,
        "kind": KIND,
        "devices": [{"name": name, "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-0"], **edits}}],
    }
    cdi_dir.mkdir(exist_ok=True)
    path = cdi_dir / f"k8s.gpu.dra-gpu.io-claim_{name}.json"
    path.write_text(json.dumps(spec))
    return path


def test_a_spec_a_runtime_can_load_passes(tmp_path: Path, host: Path) -> None:
    cdi = tmp_path / "cdi"
    _write(
        cdi,
        "good",
        "0.3.0",
        deviceNodes=[{"path": "/dev/nvidiactl"}],
        mounts=[{"hostPath": "/lib/libdragpu-limiter.so.1", "containerPath": "/l.so", "options": ["ro"]}],
    )
    preflight(cdi, [f"{KIND}=good"], host_root=host)


def test_device_node_missing_on_the_host_is_named(tmp_path: Path, host: Path) -> None:
    cdi = tmp_path / "cdi"
    path = _write(cdi, "gpu0", "0.3.0", deviceNodes=[{"path": "/dev/nvidia0"}])
    with pytest.raises(SpecRefused) as refused:
        preflight(cdi, [f"{KIND}=gpu0"], host_root=host)
    assert str(refused.value) == (
        "a container runtime would refuse these CDI specs:\n"
        f"  {path.name}: device 'gpu0': device node '/dev/nvidia0': host path '/dev/nvidia0' does not exist"
    )


def test_cdi_version_newer_than_the_runtime_is_named(tmp_path: Path, host: Path) -> None:
    cdi = tmp_path / "cdi"
    path = _write(cdi, "gpu0", "0.6.0")
    with pytest.raises(SpecRefused) as refused:
        preflight(cdi, [f"{KIND}=gpu0"], host_root=host)
    message = str(refused.value)
    assert (
        f"{path.name}: cdiVersion 0.6.0 is newer than the runtime's CDI library supports (at most 0.5.0)"
        in (message)
    )
    # A runtime with a newer CDI library would load the same file.
    preflight(cdi, [f"{KIND}=gpu0"], max_version="0.6.0", host_root=host)


def test_every_problem_of_every_spec_behind_the_ids_is_listed(tmp_path: Path, host: Path) -> None:
    cdi = tmp_path / "cdi"
    a = _write(cdi, "a", "1.0.0")
    b = _write(cdi, "b", "0.3.0", mounts=[{"hostPath": "/lib/gone.so", "containerPath": "/gone.so"}])
    with pytest.raises(SpecRefused) as refused:
        preflight(cdi, [f"{KIND}=a", f"{KIND}=b"], host_root=host)
    lines = str(refused.value).splitlines()[1:]
    assert len(lines) == 2
    assert lines[0].startswith(f"  {a.name}: cdiVersion 1.0.0 is newer")
    assert lines[1] == f"  {b.name}: device 'b': mount '/gone.so': host path '/lib/gone.so' does not exist"


def test_an_id_no_spec_defines_is_named(tmp_path: Path, host: Path) -> None:
    cdi = tmp_path / "cdi"
    _write(cdi, "gpu0", "0.3.0")
    with pytest.raises(SpecRefused, match=rf"no CDI spec in {cdi} defines {KIND}=gpu1$"):
        specs_providing(cdi, [f"{KIND}=gpu0", f"{KIND}=gpu1"])


def test_a_spec_file_that_does_not_parse_is_named(tmp_path: Path, host: Path) -> None:
    cdi = tmp_path / "cdi"
    path = _write(cdi, "gpu0", "0.3.0")
    # Still names the device, so it is the file behind the id; an unknown key makes runtimes skip it.
    spec = json.loads(path.read_text())
    spec["devices"][0]["containerEdits"]["envs"] = ["X=1"]
    path.write_text(json.dumps(spec))
    with pytest.raises(SpecRefused) as refused:
        preflight(cdi, [f"{KIND}=gpu0"], host_root=host)
    first, second = str(refused.value).splitlines()
    assert first == f"no CDI spec in {cdi} defines {KIND}=gpu0; runtimes skip these spec files:"
    assert second.startswith(f"  CDI spec {path} does not match the CDI schema: ")
    assert "envs" in second


def _share(device: str, memory: str, cores: str, n: int) -> list[Alloc]:
    """One share of `device` with this memory and these cores; `n` tells the modes' share ids apart."""
    share_id = f"00000000-0000-4000-8000-0000000000a{n}"
    return [Alloc(device=device, share_id=share_id, consumed={"memory": memory, "cores": cores})]


MODES: dict[str, tuple[list[Alloc], dict[str, Any]]] = {
    "exclusive": (
        [Alloc(device="gpu-0", request="a"), Alloc(device="gpu-1", request="b")],
        gpu_config("Exclusive"),
    ),
    "time-slicing": (
        _share("gpu-0", "8Gi", "10", 1),
        gpu_config("TimeSlicing", timeSlicing={"interval": "Medium"}),
    ),
    "mps": (_share("gpu-1", "4Gi", "20", 2), gpu_config("MPS")),
    "limiter": (_share("gpu-0", "2Gi", "30", 3), gpu_config("Limiter")),
}


def test_the_plugins_specs_for_simulated_gpus_are_loadable_by_a_real_runtime(tmp_path: Path) -> None:
    """No /dev/nvidia* that this host lacks, and the lowest cdiVersion the spec's features need."""
    library = tmp_path / "libdragpu-limiter.so.1"
    library.write_bytes(b"stand-in: only the host path's existence matters here")
    cdi = tmp_path / "cdi"
    limiter = Limiter(library, library, library)
    with plugin_node(limiter, cdi) as node:
        for mode, (allocs, config) in MODES.items():
            _, ids = node.prepare(mode, allocs, config)
            preflight(cdi, ids)  # against this host's real /dev: simulated GPUs have no nodes here
            (path,) = set(specs_providing(cdi, ids).values())
            spec = read_spec(path)
            assert spec.cdi_version == minimum_version(spec), mode
            node.unprepare_all()
