"""A tenant cannot reset or raise its claim's accounting from inside its own container.

Each container is set up as the agent sets it up (the claim's CDI spec: the limits file, the state
directory read-only, the region file a read-write mount of its own, `/etc/ld.so.preload`) and runs as a
non-root UID, as a pod's `runAsUser` does:

- deleting, truncating or replacing `dragpu-limiter.region` fails, or is noticed: the next process of
  the claim refuses its allocations instead of starting a fresh account;
- a forged limits file under the claims root (`000-forged/limits`, unlimited) cannot be written, and one
  written by the container's root is ignored or fails closed: the limit is never raised.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from container_node import Node
from container_support import Podman, Result, Volume, probe_allocated, sections
from fake_driver import CONTEXT_CHARGE, usable
from plugin_harness import Alloc, gpu_config

from dra_gpu.limiter_abi.limits import CONTAINER_CLAIMS_ROOT
from dra_gpu.limiter_abi.region import FLOOR_FILE, floor_uuids, region_counts, write_floor
from dra_gpu.quantity import parse_quantity, to_int

pytestmark = pytest.mark.container

MIB = 1024 * 1024
OOM = "CUDA_ERROR_OUT_OF_MEMORY"
TENANT = "1000:1000"
REGION = "dragpu-limiter.region"


def _run_as(
    podman: Podman,
    user: str,
    script: str,
    ids: Sequence[str],
    volumes: Sequence[Volume],
    env: dict[str, str],
) -> Result:
    """`podman.run` with `--user`: the container's processes run as that UID:GID."""
    argv = podman.argv(script, ids, volumes, env)
    at = argv.index(podman.image)
    argv[at:at] = ["--user", user]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    return Result(argv, proc.returncode, proc.stdout, proc.stderr)


def _prepare(
    node: Node, name: str, share: str, memory: str
) -> tuple[dict[str, Any], list[str], int, dict[str, str]]:
    allocs = [
        Alloc(
            device="gpu-0",
            share_id=f"7a6b5c4d-0000-4000-8000-0000000000{share}",
            consumed={"memory": memory, "cores": "100"},
        )
    ]
    claim, ids = node.prepare(name, allocs, gpu_config("Limiter"))
    cap = to_int(parse_quantity(memory))
    env = {"FAKE_CUDA_MEMORY_BYTES": str(8 * cap), "CUDA_VISIBLE_DEVICES": node.gpus["gpu-0"].uuid}
    return claim, ids, cap, env


def test_a_tenant_cannot_delete_replace_or_reset_the_region(
    node: Node, podman: Podman, driver_stand_in: list[Volume]
) -> None:
    claim, ids, cap, env = _prepare(node, "tamper-region", "01", "1Gi")
    region = f"{CONTAINER_CLAIMS_ROOT}/{claim['metadata']['uid']}/limiter/{REGION}"
    chunk = 64 * MIB
    host_region = node.claim_dir(claim) / "limiter" / REGION
    made = host_region.stat()

    tries = _run_as(
        podman,
        TENANT,
        sections(
            id="id -u",
            delete=f"rm -f {region} 2>&1; test -e {region} && echo still-there",
            rename=f"mv {region} {region}.old 2>&1; test -e {region} && echo still-there",
            replace=f"echo x > /tmp/fresh && mv -f /tmp/fresh {region} 2>&1; test -s {region} && echo still-there",
            beside=f"touch {region}.new 2>&1 || echo refused",
            alloc=f"limiter-probe alloc {chunk}",
        ),
        ids,
        driver_stand_in,
        env,
    ).check()
    assert tries.section("id") == ["1000"]
    for attempt in ("delete", "rename", "replace"):
        assert tries.section(attempt)[-1] == "still-there", (attempt, tries.section(attempt))
    assert tries.section("beside")[-1] == "refused", "nothing can be added beside the region"
    # Still the agent's file, and the claim's account: the cap holds.
    assert (host_region.stat().st_ino, host_region.stat().st_size) == (made.st_ino, made.st_size)
    assert probe_allocated(tries.section("alloc")) == (usable(cap) // chunk * chunk, OOM)

    # Truncating it works (the file is every UID's to write); the next process refuses everything
    # rather than starting a fresh account, and says why in one line.
    reset = _run_as(
        podman,
        TENANT,
        sections(truncate=f": > {region} && echo truncated", alloc=f"limiter-probe alloc {chunk}"),
        ids,
        driver_stand_in,
        env,
    )
    assert reset.section("truncate") == ["truncated"]
    # Not even the process's context is admitted: the probe cannot set up the device, and allocates nothing.
    assert reset.returncode != 0 and "cannot set up CUDA device 0: CUDA_ERROR_OUT_OF_MEMORY" in reset.stderr
    assert "allocated=" not in "\n".join(reset.section("alloc"))
    assert "refusing allocations" in reset.stderr, reset.stderr
    assert host_region.stat().st_size == 0, "the library never makes a fresh account in its place"


def test_a_forged_limits_file_never_raises_the_limit(
    node: Node, podman: Podman, driver_stand_in: list[Volume]
) -> None:
    _, ids, cap, env = _prepare(node, "forged-limits", "02", "1Gi")
    gpu = node.gpus["gpu-0"].uuid
    chunk = 64 * MIB
    forged_dir = f"{CONTAINER_CLAIMS_ROOT}/000-forged"
    forged = "\\n".join(
        [
            "version=1",
            "claim=default/forged",
            f"state={forged_dir}",
            f"device={gpu} memory=unlimited cores=100",
        ]
    )
    write = f"mkdir -p {forged_dir} && printf '{forged}\\n' > {forged_dir}/limits && echo written"

    # As the tenant's UID: the claims root is not its to write.
    tenant = _run_as(
        podman,
        TENANT,
        sections(forge=f"{write} 2>&1 || echo refused", alloc=f"limiter-probe alloc {chunk}"),
        ids,
        driver_stand_in,
        env,
    ).check()
    assert tenant.section("forge")[-1] == "refused"
    assert probe_allocated(tenant.section("alloc")) == (usable(cap) // chunk * chunk, OOM)

    # As the container's root, which can write it: the library does not trust a file it did not get from
    # the agent's read-only mount - it says so in one line and never allocates past the claim's cap.
    root = _run_as(
        podman,
        "0:0",
        sections(forge=write, alloc=f"limiter-probe alloc {chunk}"),
        ids,
        driver_stand_in,
        env,
    ).check()
    assert root.section("forge") == ["written"]
    held, last = probe_allocated(root.section("alloc"))
    # The claim's own file still limits its GPU (or the GPU is refused outright): never more than the cap.
    assert held <= cap and last == OOM, (held, last)
    assert f"{forged_dir}/limits: not a read-only mount of the node agent's" in root.stderr, root.stderr


def test_a_pod_specs_own_read_only_mount_under_the_claims_root_is_no_claim(
    node: Node, podman: Podman, driver_stand_in: list[Volume], tmp_path: Path
) -> None:
    """A pod spec chooses its own volumes: a ConfigMap mounted read-only with subPath at
    `000-forged/limits` is a read-only mount of its own, as the agent's file is. It names the real claim's
    state directory, unlimited, and sorts first: the library takes a limits file only where its state is its
    own directory's (the agent's region and floor), so it fails closed and the claim's cap holds. (The
    admission policy refuses such pods before they exist; this is the layer under it.)"""
    claim, ids, cap, env = _prepare(node, "forged-mount", "03", "1Gi")
    gpu = node.gpus["gpu-0"].uuid
    chunk = 64 * MIB
    state = f"{CONTAINER_CLAIMS_ROOT}/{claim['metadata']['uid']}/limiter"
    configmap = tmp_path / "limits"
    configmap.write_text(
        f"version=1\nclaim=default/forged\nstate={state}\ndevice={gpu} memory=unlimited cores=100\n"
    )
    configmap.chmod(0o444)
    forged = f"{CONTAINER_CLAIMS_ROOT}/000-forged/limits"
    volumes = [*driver_stand_in, Volume(configmap, forged, read_only=True)]
    result = _run_as(
        podman, TENANT, sections(alloc=f"limiter-probe alloc {chunk}"), ids, volumes, env
    ).check()
    assert probe_allocated(result.section("alloc")) == (usable(cap) // chunk * chunk, OOM)
    assert f"{forged}: state={state} is not the claim's own state directory" in result.stderr, result.stderr


def test_zeroed_counters_are_held_by_the_agents_floor(
    node: Node, podman: Podman, driver_stand_in: list[Volume]
) -> None:
    """One container of the claim holds 768 MiB of its 2 GiB and a context; the agent samples it (NVML's
    figure, published as the claim's floor); a second container zeroes every counter of the region and asks
    for 512 MiB. The region alone would grant it (a fresh account); the floor, which no container can write,
    refuses it."""
    claim, ids, _, env = _prepare(node, "zeroed", "04", "2Gi")
    state = node.claim_dir(claim) / "limiter"
    region = f"{CONTAINER_CLAIMS_ROOT}/{claim['metadata']['uid']}/limiter/{REGION}"
    gpu = node.gpus["gpu-0"].uuid
    held = 768 * MIB
    holder = subprocess.Popen(
        podman.argv(f"limiter-probe alloc {held} 1 --hold", ids, driver_stand_in, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        lines = [holder.stdout.readline().strip() for _ in range(3)]
        assert lines == ["alloc 0 ok", f"allocated={held} last=CUDA_SUCCESS", "holding"], lines
        # As the agent's watch does: the region's count, then what NVML says the claim holds (its context too).
        nvml = held + CONTEXT_CHARGE
        assert write_floor(state / FLOOR_FILE, {gpu: (nvml, region_counts(state).get(gpu, 0))}), (
            floor_uuids(state / FLOOR_FILE),
            gpu,
            sorted(p.name for p in state.iterdir()),
        )
        zero = (
            f"dd if=/dev/zero of={region} bs=1 seek=128 count=8 conv=notrunc 2>/dev/null && "
            f"for s in $(seq 0 1023); do "
            f"dd if=/dev/zero of={region} bs=1 seek=$((4096 + 32768 + s * 192 + 24)) count=128 conv=notrunc "
            f"2>/dev/null; done && echo zeroed"
        )
        result = _run_as(
            podman,
            TENANT,
            sections(zero=zero, alloc=f"limiter-probe alloc {512 * MIB} 1"),
            ids,
            driver_stand_in,
            env,
        ).check()
        assert result.section("zero") == ["zeroed"]
        assert probe_allocated(result.section("alloc")) == (0, OOM)
    finally:
        holder.kill()
        holder.wait()
