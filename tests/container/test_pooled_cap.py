"""One limiter claim, several pods: every container of the claim draws on one memory budget.

The containers have separate PID namespaces and meet only in the claim's state directory, which the
CDI spec mounts into each of them. The fake libcuda.so.1 of the limiter's tests stands in for the
driver library the NVIDIA toolkit would inject (it has the real driver's return codes).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
from container_node import Node
from container_support import Podman, Volume, probe_allocated, sections
from fake_driver import CONTEXT_CHARGE, usable
from plugin_harness import Alloc, gpu_config

from dra_gpu.limiter_abi.region import hand_back, unlocked_slots
from dra_gpu.monitor.process_owner import ProcReader
from dra_gpu.quantity import parse_quantity, to_int

pytestmark = pytest.mark.container

MIB = 1024 * 1024
OOM = "CUDA_ERROR_OUT_OF_MEMORY"


def _info(lines: list[str]) -> dict[str, int]:
    return {k: int(v) for line in lines for k, v in re.findall(r"(\w+)=(\d+)", line)}


def agent_pass(state_dir: Path) -> int:
    """What the node agent's monitor does on every sample: hands back the slots of processes gone."""
    slots = unlocked_slots(state_dir)
    index = ProcReader().process_index()
    return hand_back(state_dir, [s for s in slots if index.alive(s[1]) is False])


def test_containers_of_one_claim_share_its_memory_cap_and_a_killed_ones_memory_returns(
    node: Node, podman: Podman, driver_stand_in: list[Volume]
) -> None:
    memory = "3Gi"  # two pods' CUDA contexts and their allocations
    cap = to_int(parse_quantity(memory))
    chunk = 64 * MIB
    claim_allocs = [
        Alloc(
            device="gpu-0",
            share_id="9b8c7d6e-0000-4000-8000-000000000001",
            consumed={"memory": memory, "cores": "50"},
        )
    ]
    claim, ids = node.prepare("pooled", claim_allocs, gpu_config("Limiter"))
    state_dir = node.claim_dir(claim) / "limiter"
    physical = 4 * cap
    # The fake driver cannot see device nodes: it shows the GPUs this names, as the nodes would.
    driver_env = {"FAKE_CUDA_MEMORY_BYTES": str(physical), "CUDA_VISIBLE_DEVICES": node.gpus["gpu-0"].uuid}
    a_chunks = (usable(cap, 2) // chunk) * 5 // 8  # well under what two pods can share: all of them succeed

    probe_a = sections(info="limiter-probe info", alloc=f"limiter-probe alloc {chunk} {a_chunks} --hold")
    probe_b = sections(info="limiter-probe info", alloc=f"limiter-probe alloc {chunk} 0 --hold")
    with contextlib.ExitStack() as pods:
        pod_a = pods.enter_context(podman.background(probe_a, ids, driver_stand_in, driver_env))
        a_out = pod_a.read_until("holding")
        a_held, a_last = probe_allocated(a_out)
        assert (a_held, a_last) == (a_chunks * chunk, "CUDA_SUCCESS")
        assert _info(a_out)["total"] == cap, "cuMemGetInfo reports the claim's cap, not the GPU's memory"
        assert _info(a_out)["free"] == cap - CONTEXT_CHARGE, (
            "the pod's own CUDA context is charged to the claim"
        )

        # The node agent's pass (every sample of its monitor) hands back the slot of A's `info` process: a
        # container in another PID namespace could not prove it gone.
        agent_pass(state_dir)
        # B starts once A holds its memory, and allocates until refused.
        pod_b = pods.enter_context(podman.background(probe_b, ids, driver_stand_in, driver_env))
        b_out = pod_b.read_until("holding")
        b_held, b_last = probe_allocated(b_out)
        b_info = _info(b_out)
        free = cap - a_held - 2 * CONTEXT_CHARGE  # less A's memory and both pods' contexts
        assert (b_info["total"], b_info["device_total"], b_info["free"]) == (cap, cap, free)
        # Together they stop at the claim's cap, and the pod that hits it gets the driver's own error.
        assert b_last == OOM
        assert usable(cap, 2) - chunk < a_held + b_held <= usable(cap, 2)
        assert f"alloc {b_held // chunk} {OOM}" in b_out

        killed = pod_a.kill()
        assert killed != 0, "pod A ran until killed"
        assert pod_b.proc.poll() is None, "pod B still holds its memory"

        agent_pass(state_dir)
        # A new pod of the claim gets exactly what the killed one held: the cap is still shared with B.
        after = podman.run(
            sections(info="limiter-probe info", alloc=f"limiter-probe alloc {chunk}"),
            ids,
            driver_stand_in,
            driver_env,
        ).check()
        left = usable(cap, 2) - b_held  # B's context and the new pod's are charged
        assert _info(after.section("info"))["free"] == left
        c_held, c_last = probe_allocated(after.section("alloc"))
        assert c_last == OOM
        assert c_held == (left // chunk) * chunk
        assert c_held >= a_held, "the killed pod's memory went back to the claim"
