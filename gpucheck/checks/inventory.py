"""`dra-gpu gpus` (NVML) against `nvidia-smi`: what the driver would publish is what the GPU is."""

from __future__ import annotations

import json
import re
from typing import Any

from gpucheck.context import MIB, Context
from gpucheck.parse import smi_csv
from gpucheck.proc import run, which
from gpucheck.report import Result, failed, skipped, verdict

FIELDS = ("index", "uuid", "memory.total", "driver_version", "compute_cap", "mig.mode.current")
_CUDA_VERSION = re.compile(r"CUDA Version:\s*([0-9.]+)")


def inventory(ctx: Context) -> Result:
    name = "inventory"
    smi = which("nvidia-smi")
    if smi is None:
        return skipped(name, "nvidia-smi not found: nothing to compare NVML's inventory with")
    ours = run([ctx.python, "-m", "dra_gpu.cli", "gpus", "-o", "json"], env=ctx.project_env(), timeout_s=120)
    query = run([smi, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"], timeout_s=60)
    header = run([smi], timeout_s=60)
    details = ours.describe() + query.describe()
    if not ours.ok:
        result = failed(name, f"dra-gpu gpus failed: {ours.why()}")
    elif not query.ok:
        result = failed(name, f"nvidia-smi failed: {query.why()}")
    else:
        try:
            result = compare(json.loads(ours.stdout), smi_csv(query.stdout, FIELDS), header.stdout)
        except ValueError as exc:
            result = failed(name, f"output not understood: {exc}")
    result.details += details
    return result


def compare(ours: list[dict[str, Any]], smi: list[dict[str, str]], smi_header: str) -> Result:
    """Each GPU: UUID, memory (MiB), driver and CUDA versions, compute capability, MIG capability."""
    name = "inventory"
    problems = []
    cuda = _CUDA_VERSION.search(smi_header)
    by_uuid = {g["uuid"]: g for g in ours}
    if sorted(by_uuid) != sorted(r["uuid"] for r in smi):
        problems.append(
            f"UUIDs differ: dra-gpu {sorted(by_uuid)} vs nvidia-smi {sorted(r['uuid'] for r in smi)}"
        )
    for row in smi:
        gpu = by_uuid.get(row["uuid"])
        if gpu is None:
            continue
        label = f"GPU {row['index']}"
        if str(gpu["index"]) != row["index"]:
            problems.append(f"{label}: index {gpu['index']} vs {row['index']}")
        if row["memory.total"] and int(gpu["memoryBytes"]) // MIB != int(float(row["memory.total"])):
            problems.append(
                f"{label}: memory {int(gpu['memoryBytes']) // MIB} MiB vs {row['memory.total']} MiB"
            )
        if gpu["driverVersion"] != row["driver_version"]:
            problems.append(f"{label}: driver {gpu['driverVersion']} vs {row['driver_version']}")
        if row["compute_cap"] and gpu["cudaComputeCapability"] != row["compute_cap"]:
            problems.append(
                f"{label}: compute capability {gpu['cudaComputeCapability']} vs {row['compute_cap']}"
            )
        mig_capable = row["mig.mode.current"] != ""
        if bool(gpu["migCapable"]) != mig_capable:
            problems.append(
                f"{label}: MIG capable {gpu['migCapable']} vs MIG mode {row['mig.mode.current'] or 'N/A'}"
            )
        if cuda and gpu.get("cudaDriverVersion") and gpu["cudaDriverVersion"] != cuda.group(1):
            problems.append(f"{label}: CUDA version {gpu['cudaDriverVersion']} vs {cuda.group(1)}")
    return verdict(
        name,
        not problems,
        "; ".join(problems)
        if problems
        else f"{len(smi)} GPU(s) agree: UUID, memory, driver, CUDA, compute capability, MIG",
        gpus=ours,
        nvidia_smi=smi,
        nvidia_smi_cuda=cuda.group(1) if cuda else None,
    )
