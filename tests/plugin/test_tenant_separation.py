"""What one tenant of a shared GPU can take from the others: the MPS daemon, and a time-sliced
claim's memory beside limiter claims."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from fake_driver import usable
from plugin_harness import (
    Alloc,
    PluginDirs,
    add_claim,
    cdi_ids,
    claim_process_env,
    gpu_config,
    opaque,
    registered_kubelet,
    resolve,
    share_claim,
    uid_of,
)

from dra_gpu.inventory.simulated import SIMULATED_DRIVER_VERSION
from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi.limits import CONTAINER_PRELOAD
from dra_gpu.plugin.prepare import NOTICE_REASON

MiB = 2**20
GiB = 2**30
TOOLS = ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def driver_root(root: Path) -> Path:
    """A host's driver files as the agent finds them: libcuda, NVML and the tools, MPS's included."""
    libs = root / "usr" / "lib" / "x86_64-linux-gnu"
    libs.mkdir(parents=True)
    for stem in ("libcuda.so", "libnvidia-ml.so"):
        (libs / f"{stem}.{SIMULATED_DRIVER_VERSION}").write_bytes(b"\x7fELF stand-in\n")
    (root / "usr" / "bin").mkdir(parents=True)
    for tool in TOOLS:
        (root / "usr" / "bin" / tool).write_text("#!/bin/sh\n")
        (root / "usr" / "bin" / tool).chmod(0o755)
    return root


def mps(name: str, api: FakeKube, device: str = "gpu-0", **mps_config: object) -> dict:
    """An MPS share of a tenth of the GPU, as the scheduler allocates it."""
    section = {"mps": mps_config} if mps_config else {}
    share_id = f"b0000000-0000-4000-8000-{len(api.objects('ResourceClaim')):012d}"
    return add_claim(
        api,
        name,
        [Alloc(device=device, share_id=share_id, consumed={"memory": "8Gi", "cores": "10"})],
        [opaque(gpu_config("MPS", **section))],
    )


def prepare(dirs: PluginDirs, api: FakeKube, *claims: dict, **config: Any) -> dict[str, Any]:
    with registered_kubelet(dirs, api, **config) as (_, kubelet):
        responses = {c["metadata"]["name"]: kubelet.prepare(c)[uid_of(c)] for c in claims}
    return responses


# -- MPS ---------------------------------------------------------------------------------------------
def test_no_container_gets_the_mps_control_program(dirs: PluginDirs, api: FakeKube, tmp_path: Path) -> None:
    """With it, any tenant could `quit` the daemon that every MPS claim on the GPU uses."""
    claims = [
        mps("mps", api),
        add_claim(api, "whole", [Alloc(device="gpu-1")], [opaque(gpu_config("Exclusive"))]),
    ]
    responses = prepare(dirs, api, *claims, driver_root=driver_root(tmp_path / "root"))
    for name, response in responses.items():
        assert response.error == "", name
        container = resolve(dirs, cdi_ids(response))
        tools = sorted(m.container_path for m in container.mounts if m.container_path.startswith("/usr/bin/"))
        assert tools == ["/usr/bin/nvidia-smi"], name


def test_mps_claims_of_different_uids_never_share_a_gpus_daemon(dirs: PluginDirs, api: FakeKube) -> None:
    first = mps("uid-1000", api, runAsUser=1000)
    other_uid = mps("uid-2000", api, runAsUser=2000)
    same_uid = mps("uid-1000-too", api, runAsUser=1000)
    other_gpu = mps("uid-2000-gpu-1", api, device="gpu-1", runAsUser=2000)
    responses = prepare(dirs, api, first, other_uid, same_uid, other_gpu)
    errors = {name: r.error for name, r in responses.items()}
    assert errors["uid-1000"] == errors["uid-1000-too"] == errors["uid-2000-gpu-1"] == ""
    assert "serves MPS claim default/uid-1000 as UID 1000" in errors["uid-2000"]
    assert "sharing.mps.runAsUser 2000" in errors["uid-2000"]
    assert "\n" not in errors["uid-2000"]


def test_an_mps_claim_that_declares_no_uid_is_told_to(dirs: PluginDirs, api: FakeKube) -> None:
    claim = mps("anyone", api)
    assert prepare(dirs, api, claim)["anyone"].error == ""
    messages = [
        e["message"]
        for e in api.objects("Event")
        if e["involvedObject"]["uid"] == uid_of(claim) and e["reason"] == NOTICE_REASON
    ]
    assert any("sharing.mps.runAsUser is not set" in m for m in messages), messages


# -- time-slicing beside limiter claims --------------------------------------------------------------
def _limiter(api: FakeKube) -> dict:
    return share_claim(api, "capped", device="gpu-1", memory="1Gi", cores="50")


def _timesliced(api: FakeKube, consumed: dict[str, str] | None) -> dict:
    return add_claim(
        api,
        "sliced",
        [Alloc(device="gpu-1", share_id="a0000000-0000-4000-8000-000000000002", consumed=consumed)],
        [opaque(gpu_config("TimeSlicing"))],
    )


def test_a_time_sliced_claim_beside_a_limiter_claim_cannot_take_more_than_it_was_charged(
    dirs: PluginDirs, api: FakeKube, built: Path
) -> None:
    limited, sliced = _limiter(api), _timesliced(api, {"memory": "1Gi", "cores": "50"})
    responses = prepare(dirs, api, limited, sliced)
    response = responses["sliced"]
    assert response.error == ""
    container = resolve(dirs, cdi_ids(response))
    assert CONTAINER_PRELOAD in [m.container_path for m in container.mounts], (
        "the library loads in every process"
    )
    env = claim_process_env(built, container)
    done = subprocess.run(
        [str(built / "limiter-probe"), "alloc", str(384 * MiB), "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # The fake GPU has 80 GiB; the claim was charged 1 GiB, and that (less its process's context) is all it gets.
    allocated = usable(GiB) // (384 * MiB) * 384 * MiB
    assert done.stdout.splitlines()[-1] == f"allocated={allocated} last=CUDA_ERROR_OUT_OF_MEMORY", done.stdout


def test_an_uncapped_time_sliced_claim_and_a_limiter_claim_never_share_a_gpu(dirs: PluginDirs) -> None:
    """Without consumable capacity there is no amount to cap a time-sliced claim to."""
    api = FakeKube()
    limited, sliced = _limiter(api), _timesliced(api, None)
    errors = {n: r.error for n, r in prepare(dirs, api, limited, sliced).items()}
    assert errors["capped"] == ""
    assert (
        "hosts limiter claim default/capped; this time-sliced claim has no consumed memory"
        in errors["sliced"]
    )

    other = PluginDirs.create()
    try:
        api = FakeKube()
        sliced, limited = _timesliced(api, None), _limiter(api)
        errors = {n: r.error for n, r in prepare(other, api, sliced, limited).items()}
        assert errors["sliced"] == ""
        assert "hosts claim default/sliced, time-sliced without a memory cap" in errors["capped"]
    finally:
        other.cleanup()
