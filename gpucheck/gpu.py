"""Finding the GPU to check: `nvidia-smi`, or NVML where the tool is missing."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpucheck.parse import mib_to_bytes, smi_csv
from gpucheck.proc import run, which

QUERY = ("index", "uuid", "name", "memory.total", "driver_version", "compute_mode", "mig.mode.current")


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    driver_version: str
    compute_mode: str = ""
    mig_mode: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def gpus_from_smi(text: str) -> list[Gpu]:
    out = []
    for row in smi_csv(text, QUERY):
        out.append(
            Gpu(
                index=int(row["index"]),
                uuid=row["uuid"],
                name=row["name"],
                memory_bytes=mib_to_bytes(row["memory.total"]) or 0,
                driver_version=row["driver_version"],
                compute_mode=row["compute_mode"],
                mig_mode=row["mig.mode.current"],
            )
        )
    return out


def _from_nvml() -> tuple[list[Gpu], str]:
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], f"NVML: {exc}"
    try:
        gpus = []
        driver = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            gpus.append(
                Gpu(
                    index=i,
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    driver_version=driver.decode() if isinstance(driver, bytes) else str(driver),
                )
            )
        return gpus, "" if gpus else "NVML reports no GPU"
    finally:
        pynvml.nvmlShutdown()


def find_gpus() -> tuple[list[Gpu], str]:
    """The node's GPUs and, when there are none, why (one line)."""
    smi = which("nvidia-smi")
    reasons = []
    if smi is not None:
        ran = run([smi, f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"], timeout_s=60)
        if ran.ok:
            try:
                gpus = gpus_from_smi(ran.stdout)
            except ValueError as exc:
                reasons.append(f"nvidia-smi output not understood: {exc}")
            else:
                if gpus:
                    return gpus, ""
                reasons.append("nvidia-smi lists no GPU")
        else:
            reasons.append(f"nvidia-smi: {ran.why()}")
    else:
        reasons.append("nvidia-smi not found")
    gpus, why = _from_nvml()
    if gpus:
        return gpus, ""
    reasons.append(why)
    return [], "; ".join(reasons)


def pick(gpus: list[Gpu], wanted: str) -> Gpu | None:
    """The GPU named by index or UUID (GPU_CHECK_GPU), the first one when `wanted` is empty."""
    if not wanted:
        return gpus[0] if gpus else None
    for gpu in gpus:
        if wanted in (str(gpu.index), gpu.uuid):
            return gpu
    return None
