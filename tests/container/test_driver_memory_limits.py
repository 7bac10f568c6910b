"""The claim's CDI spec runs our hook at createRuntime (runc via podman), against the fake NVML, and
the limits land on that container's own cgroup, before its first command runs."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from container_node import Limiter, Node, plugin_node
from container_support import REPO_ROOT, Podman, Volume, sections
from fake_driver import usable
from plugin_harness import Alloc, gpu_config

pytestmark = pytest.mark.container

GIB = 2**30
UNIFIED = Path("/sys/fs/cgroup/unified")
"""cgroup v2 of a hybrid host (this kind of machine); on a pure cgroup-v2 host it is /sys/fs/cgroup."""


def cgroup_v2_root() -> Path:
    if (Path("/sys/fs/cgroup") / "cgroup.controllers").is_file():
        return Path("/sys/fs/cgroup")
    return UNIFIED


@pytest.fixture
def node_615(podman: Podman, limiter_build: Limiter) -> Iterator[Node]:
    with plugin_node(
        limiter_build, podman.cdi_dir, profile="1xH100-80GB,driver=615.71.09,cgroup=misc"
    ) as node:
        yield node
        node.unprepare_all()


@pytest.fixture
def hook(tmp_path: Path, node_615: Node, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The hook as the runtime runs it: dra-gpu, pointed at the fake NVML (the GPU node's stand-in)."""
    log = tmp_path / "nvml-calls.jsonl"
    log.write_text("")
    config = tmp_path / "fake-nvml.json"
    gpu = node_615.gpus["gpu-0"]
    config.write_text(
        json.dumps(
            {
                "driver_version": "615.71.09",
                "gpus": [{"uuid": gpu.uuid, "memory_total": gpu.memory_bytes}],
                "backend": "misc",
                "cgroup_root": str(cgroup_v2_root()),
                "log": str(log),
            }
        )
    )
    wrapper = tmp_path / "dra-gpu-hook"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export DRA_GPU_NVML_MODULE=fake_pynvml PYTHONPATH={REPO_ROOT / 'tests' / 'fakes'} "
        f"FAKE_NVML_CONFIG={config} DRA_GPU_CGROUP_ROOT={cgroup_v2_root()}\n"
        f'exec {Path(sys.executable).parent / "dra-gpu"} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("DRA_GPU_CDI_HOOK_PATH", str(wrapper))
    return log


def test_hook_sets_the_claims_request_and_limit_on_the_containers_cgroup_before_it_starts(
    node_615: Node, podman: Podman, hook: Path, driver_stand_in: list[Volume]
) -> None:
    alloc = Alloc(
        device="gpu-0",
        share_id="3c2b1a00-0000-4000-8000-000000000001",
        consumed={"memory": "2Gi", "cores": "50"},
    )
    config = gpu_config("Limiter", limiter={"memoryLimit": "3Gi"})
    claim, ids = node_615.prepare("driver-limits", [alloc], config)
    script = sections(
        cgroup="cat /proc/self/cgroup", limits="cat /nvml-calls.jsonl", probe="limiter-probe info"
    )
    volumes = [Volume(hook, "/nvml-calls.jsonl"), *driver_stand_in]
    result = podman.run(
        script,
        devices=ids,
        volumes=volumes,
        env={"FAKE_CUDA_MEMORY_BYTES": str(16 * GIB), "CUDA_VISIBLE_DEVICES": node_615.gpus["gpu-0"].uuid},
    ).check()

    (own,) = [line[3:] for line in result.section("cgroup") if line.startswith("0::")]
    seen = [json.loads(line) for line in result.section("limits") if line.strip()]
    uuid = node_615.gpus["gpu-0"].uuid
    # Already set when the container's first command ran, on that container's own cgroup.
    assert seen[:1] == [
        {"uuid": uuid, "cgroup": str(cgroup_v2_root()) + own, "soft": 2 * GIB, "hard": 3 * GIB}
    ]
    assert own.strip("/"), "the container has a cgroup of its own, not the root"
    # The reported total is the claim's limit (the ceiling), as the driver reports the hard limit.
    # Free: the limit less the probe's own CUDA context, which the claim is charged.
    assert result.section("probe") == [f"total={3 * GIB} free={usable(3 * GIB)}", f"device_total={3 * GIB}"]
    # Teardown: the poststop hook ran and took the record. runc removes the container's cgroup before
    # poststop hooks run, so there was no leaf left to clear through NVML; under dmem the hook gives the
    # ancestors' dmem.min back from the record instead (tests/commands/test_cdi_hook_memory.py).
    records = node_615.claim_dir(claim) / "memory-limits"
    assert not list(records.rglob("*.json"))
    assert len(hook.read_text().splitlines()) == 1, "no NVML clear call: the leaf was already gone"
    assert not (cgroup_v2_root() / own.strip("/")).exists()
    node_615.unprepare(claim)
    assert not records.exists()
