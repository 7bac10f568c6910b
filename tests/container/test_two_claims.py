"""A container that uses two limiter claims keeps both claims' limits.

Each claim's spec mounts its own limits file and state directory under /run/dra-gpu/claims/<uid>/ and
sets no limiter environment, so nothing of one claim overwrites the other's; the library loads from
/etc/ld.so.preload and reads every claim's limits file.
"""

from __future__ import annotations

import pytest
from container_node import Node
from container_support import Podman, Volume, sections
from fake_driver import usable
from plugin_harness import Alloc, gpu_config

from dra_gpu.quantity import parse_quantity, to_int

pytestmark = pytest.mark.container

MIB = 1024 * 1024


def test_a_container_using_two_claims_keeps_both_claims_limits(
    node: Node, podman: Podman, driver_stand_in: list[Volume]
) -> None:
    limiter = gpu_config("Limiter")
    share = "5a6b7c8d-0000-4000-8000-0000000000"
    caps = {"gpu-0": "1Gi", "gpu-1": "2Gi"}
    ids: list[str] = []
    for device, memory in caps.items():
        alloc = Alloc(
            device=device, share_id=share + device[-1] + "0", consumed={"memory": memory, "cores": "50"}
        )
        ids += node.prepare(f"claim-{device}", [alloc], limiter)[1]
    a, b = node.gpus["gpu-0"].uuid, node.gpus["gpu-1"].uuid
    chunk = 256 * MIB
    # The fake driver cannot see device nodes; it shows the GPUs CUDA_VISIBLE_DEVICES names, as the
    # two claims' device nodes would, and the probe works on the first of them.
    script = sections(
        env="env",
        info_a=f"CUDA_VISIBLE_DEVICES={a},{b} limiter-probe info",
        alloc_a=f"CUDA_VISIBLE_DEVICES={a},{b} limiter-probe alloc {chunk}",
        info_b=f"CUDA_VISIBLE_DEVICES={b},{a} limiter-probe info",
        alloc_b=f"CUDA_VISIBLE_DEVICES={b},{a} limiter-probe alloc {chunk}",
    )
    result = podman.run(
        script, devices=ids, volumes=driver_stand_in, env={"FAKE_CUDA_MEMORY_BYTES": str(80 << 30)}
    )
    result.check()

    cap_a, cap_b = (to_int(parse_quantity(m)) for m in caps.values())
    assert not any(
        k.startswith(("DRAGPU_MEMORY", "DRAGPU_CORES", "DRAGPU_LIMITER", "LD_PRELOAD")) for k in result.env()
    )
    # Each probe's CUDA context is charged to the claim of its GPU; the rest goes in whole chunks.
    free_a, free_b = usable(cap_a), usable(cap_b)
    assert result.section("info_a") == [f"total={cap_a} free={free_a}", f"device_total={cap_a}"]
    assert result.section("info_b") == [f"total={cap_b} free={free_b}", f"device_total={cap_b}"]
    allocated_a, allocated_b = free_a // chunk * chunk, free_b // chunk * chunk
    assert allocated_a != allocated_b, "the two claims' limits must be told apart"
    assert result.section("alloc_a")[-1] == f"allocated={allocated_a} last=CUDA_ERROR_OUT_OF_MEMORY"
    assert result.section("alloc_b")[-1] == f"allocated={allocated_b} last=CUDA_ERROR_OUT_OF_MEMORY"
