"""The node path end to end, run in its own process by the node-path check (it needs the project).

`python3 -m gpucheck.nodepath GC_DRV LIMITER CAP_BYTES CORES [INVENTORY]` starts the kubelet plugin
with the NVML inventory (or INVENTORY, e.g. `simulated:1xH100-80GB` for a test against the limiter's
fake driver) and the real `nvidia-smi` commands, against the in-memory API server; registers and
prepares a Limiter claim over gRPC on the plugin's unix sockets; resolves the claim's CDI devices;
runs GC_DRV with exactly that environment, each mount's container path replaced by its host path (no
container runtime here); checks the cap it sees; unprepares; and prints one JSON result on stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

NODE = "gpu-check-node"
MIB = 1024 * 1024


def claim_object(name: str, device: str, share_id: str, memory: int, cores: int) -> dict[str, Any]:
    """An allocated, reserved Limiter claim, shaped as the API server returns it after scheduling."""
    from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
    from dra_gpu.kube import builders

    parameters = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "sharing": {"strategy": "Limiter"}}
    asked = {"memory": str(memory), "cores": str(cores)}
    result = builders.device_result("gpu", DRIVER_NAME, NODE, device, share_id=share_id, consumed=asked)
    allocated = builders.allocation(
        [result], [builders.opaque_config(DRIVER_NAME, parameters, source="FromClass")], node_name=NODE
    )
    return builders.allocated_claim(
        builders.claim(name, f"limiter.{DRIVER_NAME}", capacity=asked),
        allocated,
        {"resource": "pods", "name": f"{name}-pod", "uid": f"pod-{name}"},
    )


def host_environment(env: dict[str, str], mounts: list[tuple[str, str]]) -> dict[str, str]:
    """The container's environment with each mount's container path replaced by its host path."""
    out = dict(env)
    for container_path, host_path in sorted(mounts, key=lambda m: -len(m[0])):
        out = {k: v.replace(container_path, host_path) for k, v in out.items()}
    return out


def _result(status: str, summary: str, figures: dict[str, Any], details: list[str]) -> int:
    print(json.dumps({"status": status, "summary": summary, "figures": figures, "details": details}))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(
            "usage: python3 -m gpucheck.nodepath GC_DRV LIMITER CAP_BYTES CORES [INVENTORY]", file=sys.stderr
        )
        return 2
    program, limiter, cap, cores = Path(argv[0]), Path(argv[1]).resolve(), int(argv[2]), int(argv[3])
    inventory_spec = argv[4] if len(argv) == 5 else "nvml"

    from cdi.resolver import Registry
    from dra_gpu.config import NodeSharing
    from dra_gpu.demo.kubelet import KubeletStandIn
    from dra_gpu.host.nvidia import NvidiaCommands
    from dra_gpu.inventory import open_inventory
    from dra_gpu.kube import builders, objects
    from dra_gpu.kube.fake import FakeKube
    from dra_gpu.node_agent import NodeAgent, NodeAgentConfig
    from dra_gpu.plugin.sharing.modes.limiter import host_environment_of
    from dra_gpu.plugin.sharing.steps.device_access import device_uuids
    from dra_gpu.vocabulary.device import device_name

    root = Path(tempfile.mkdtemp(prefix="gcn-", dir="/tmp"))  # unix socket paths must stay short
    details: list[str] = []
    figures: dict[str, Any] = {"cap_bytes": cap, "cores": cores}
    config = NodeAgentConfig(
        node_name=NODE,
        state_dir=root / "state",
        cdi_dir=root / "cdi",
        registration_dir=root / "reg",
        plugins_dir=root / "plugins",
        limiter_library=limiter,
    )
    config.cdi_dir.mkdir(parents=True)
    inventory = open_inventory(inventory_spec, seed=NODE)
    wanted = os.environ.get("GPU_CHECK_UUID", "")
    gpus = inventory.gpus()
    gpu = next((g for g in gpus if g.uuid == wanted), gpus[0] if gpus else None)
    if gpu is None:
        return _result("fail", "the NVML inventory has no GPU", figures, details)
    api = FakeKube()
    plugin = NodeAgent(
        config, api, inventory, NvidiaCommands(isolate_shm=True), sharing=NodeSharing.parse("*=Shared")
    )
    plugin.start()
    kubelet = KubeletStandIn(config.registration_socket, timeout_s=60)
    try:
        deadline = time.monotonic() + 30
        while not config.registration_socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        kubelet.register()
        wanted_claim = claim_object("gpu-check", device_name(gpu.index), str(uuid.uuid4()), cap, cores)
        claim = api.create("ResourceClaim", builders.with_status(wanted_claim, {}))
        claim = api.update_status("ResourceClaim", builders.with_status(claim, objects.status(wanted_claim)))
        prepared = kubelet.prepare([claim])[objects.uid(claim)]
        if prepared.error:
            return _result("fail", f"prepare failed: {prepared.error}", figures, details)
        ids = [i for d in prepared.devices for i in d.cdi_ids]
        figures["cdi_ids"] = ids
        container = Registry.load([*(config.nvidia_ctk_dirs or (Path("/etc/cdi"),)), config.cdi_dir]).resolve(
            ids
        )
        mounts = [(m.container_path, m.host_path) for m in container.mounts]
        env = host_environment(container.env, mounts)
        # In a container the claim's device nodes decide what CUDA sees; here, the same GPUs by UUID.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(device_uuids(container.env))
        env.update(host_environment_of(mounts))  # what the library reads from the limits file in a container
        env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
        if "LD_LIBRARY_PATH" in os.environ and "LD_LIBRARY_PATH" not in env:
            # Where the driver's libraries are, which the NVIDIA runtime's hooks provide in a container.
            env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
        figures["environment"] = {
            k: v for k, v in env.items() if k.startswith(("DRAGPU_", "LD_PRELOAD", "CUDA_"))
        }
        figures["mounts"] = mounts
        info = subprocess.run([program, "info"], env=env, capture_output=True, text=True, timeout=120)
        fill = subprocess.run(
            [program, "family", "mem", str(256 * MIB), str(2 * cap)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        details += [
            f"$ {program} info -> {info.returncode}",
            *info.stdout.splitlines()[-6:],
            *info.stderr.splitlines()[-3:],
        ]
        details += [
            f"$ {program} family mem -> {fill.returncode}",
            *fill.stdout.splitlines()[-6:],
            *fill.stderr.splitlines()[-3:],
        ]
        values = dict(
            line.split("=", 1) for line in info.stdout.splitlines() + fill.stdout.splitlines() if "=" in line
        )
        total, allocated = int(values.get("total", -1)), int(values.get("allocated", -1))
        figures.update(reported_total=total, allocated=allocated, last=values.get("last"))
        errors = kubelet.unprepare([claim])
        left = sorted(p.name for p in config.cdi_dir.iterdir() if not p.name.startswith("."))
        claims_dir = config.state_dir / "claims"
        claim_dirs = sorted(p.name for p in claims_dir.iterdir()) if claims_dir.is_dir() else []
        figures.update(
            unprepare_error=errors.get(objects.uid(claim), ""),
            cdi_specs_left=left,
            claim_dirs_left=claim_dirs,
        )
        problems = []
        if env.get("DRAGPU_CORES_LIMIT") != str(cores):
            problems.append(f"DRAGPU_CORES_LIMIT={env.get('DRAGPU_CORES_LIMIT')}, expected {cores}")
        if total != cap:
            problems.append(f"the program sees total {total}, not the claim's {cap}")
        if not 0 < allocated <= cap:
            problems.append(f"allocated {allocated} under a cap of {cap}")
        if figures["unprepare_error"] or left or claim_dirs:
            problems.append(
                f"unprepare: error {figures['unprepare_error']!r}, CDI specs left {left}, claim state left {claim_dirs}"
            )
        if problems:
            return _result("fail", "; ".join(problems), figures, details)
        return _result(
            "pass",
            f"prepared {ids[0]}; under its CDI environment total = {cap / MIB:.0f} MiB, allocated "
            f"{allocated / MIB:.0f} MiB, then {values.get('last')}; unprepared, no spec left",
            figures,
            details,
        )
    finally:
        kubelet.close()
        plugin.stop(grace_s=0.5)
        inventory.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
