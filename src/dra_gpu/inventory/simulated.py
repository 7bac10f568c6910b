"""A node's GPUs described by a profile string, for CPU-only clusters, demos and tests.

Everything is derived from the profile and a seed (the node name), never from randomness or the
clock: the same node always shows the same UUIDs, so its ResourceSlice and the claims prepared
against it survive a restart exactly as they would on real hardware, while two simulated nodes
still have distinct GPUs.
"""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass, replace

from dra_gpu.inventory.capabilities import Capabilities, CgroupLayout, detect, driver_major, with_capabilities
from dra_gpu.inventory.mig import MigInstance, overlaps, simulated_mig_uuid
from dra_gpu.inventory.mig_profiles import MIG_TABLES, MigProfile, profile_memory
from dra_gpu.inventory.models import KNOWN_MODELS, GpuModel, find_model
from dra_gpu.inventory.types import GpuInfo, InventoryError

SIMULATED_DRIVER_VERSION = "580.95.05"
SIMULATED_CUDA_VERSION = "13.0"
MAX_SIMULATED_GPUS = 128
"""A ResourceSlice holds at most 128 devices; more GPUs than that on one node is a typo."""

_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simulated.gpu.dra-gpu.io")
# Bus numbers of the eight GPUs of an HGX H100 board; further GPUs go to further PCI domains.
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_PART = re.compile(r"^(\d+)\s*[xX]\s*(\S+)$")


def known_models_text() -> str:
    return ", ".join(KNOWN_MODELS)


def parse_profile(profile: str) -> list[GpuModel]:
    """One model per GPU, in index order, from a profile such as 2xH100-80GB,1xL4-24GB."""
    return [model for model, _ in parse_gpus(profile)]


def parse_gpus(profile: str) -> list[tuple[GpuModel, SimulatedMig | None]]:
    """One (model, MIG layout or None) per GPU: `1xH100-80GB:mig`, `1xH100-80GB:mig=1g.10gb*7`."""

    def bad(part: str, why: str) -> InventoryError:
        return InventoryError(
            f"bad GPU profile {profile!r}: {part!r} {why}; expected COUNTxMODEL[,COUNTxMODEL...] "
            f"such as 2xH100-80GB,1xL4-24GB; known models: {known_models_text()}"
        )

    if not profile.strip():
        raise bad(profile, "is empty")
    gpus: list[tuple[GpuModel, SimulatedMig | None]] = []
    for raw in profile.split(","):
        part, _, mig_text = raw.strip().partition(":")
        part = part.strip()
        match = _PART.match(part)
        if match is None:
            if find_model(part) is not None:
                raise bad(part, f"has no count (write 1x{part} for one GPU)")
            raise bad(part, "is not COUNTxMODEL")
        count, name = int(match.group(1)), match.group(2)
        model = find_model(name)
        if model is None:
            raise bad(part, f"names an unknown GPU model {name!r}")
        if count < 1:
            raise bad(part, "asks for no GPUs (the count must be at least 1)")
        mig = parse_mig(model, mig_text, raw.strip()) if mig_text else None
        gpus.extend([(model, mig)] * count)
        if len(gpus) > MAX_SIMULATED_GPUS:
            raise bad(part, f"brings the node above {MAX_SIMULATED_GPUS} GPUs")
    return gpus


@dataclass(frozen=True)
class SimulatedMig:
    """A GPU in MIG mode: with `profiles` it has those instances (static), else none (dynamic)."""

    profiles: tuple[str, ...] = ()


def parse_mig(model: GpuModel, text: str, part: str) -> SimulatedMig:
    """`mig` or `mig=3g.40gb/1g.10gb*4`: profiles in creation order, `*N` for N of one."""
    usage = "write MODEL:mig (dynamic) or MODEL:mig=PROFILE[*N][/PROFILE[*N]...] such as 1xH100-80GB:mig=1g.10gb*7"
    key, sep, value = text.partition("=")
    if key.strip().lower() != "mig" or (sep and not value.strip()):
        raise InventoryError(f"bad GPU profile part {part!r}: {usage}")
    table = MIG_TABLES.get(model.key)
    if table is None:
        capable = ", ".join(MIG_TABLES)
        raise InventoryError(
            f"bad GPU profile part {part!r}: {model.key} has no MIG profiles here ({capable} do)"
        )
    profiles: list[str] = []
    for entry in filter(None, (e.strip() for e in value.split("/"))):
        name, star, times = entry.partition("*")
        found = table.find(name)
        if found is None:
            raise InventoryError(
                f"bad GPU profile part {part!r}: {model.key} has no MIG profile {name.strip()!r}; "
                f"it has {table.names()}"
            )
        if star and not (times.strip().isdigit() and int(times) >= 1):
            raise InventoryError(
                f"bad GPU profile part {part!r}: {entry!r} needs a count of at least 1 after '*'"
            )
        profiles.extend([found.name] * (int(times) if star else 1))
    return SimulatedMig(tuple(profiles))


def simulated_instances(gpu: GpuInfo, model: GpuModel, mig: SimulatedMig) -> tuple[MigInstance, ...]:
    """The layout as an admin (or a MIG manager) would make it: a placement for every instance.

    Larger profiles are placed first, each trying its starts from the last, with backtracking, so
    that `3g.40gb/1g.10gb*4` fits as it does on the real GPU (3g at slice 4, the 1g ones below).
    """
    table = MIG_TABLES[model.key]
    wanted = [table.find(name) for name in mig.profiles]
    profiles = sorted((p for p in wanted if p is not None), key=lambda p: -p.memory_slices)

    def place(i: int, made: list[tuple[MigProfile, int]]) -> list[tuple[MigProfile, int]] | None:
        if i == len(profiles):
            return made
        for start in reversed(profiles[i].starts):
            span = (start, profiles[i].memory_slices)
            if not any(overlaps(span, (s, p.memory_slices)) for p, s in made):
                found = place(i + 1, [*made, (profiles[i], start)])
                if found is not None:
                    return found
        return None

    full = table.full
    for engine in ("compute_slices", "copy_engines", "decoders", "jpeg_decoders", "ofa"):
        if sum(getattr(p, engine) for p in profiles) > getattr(full, engine):
            raise InventoryError(
                f"bad GPU profile: MIG {'/'.join(mig.profiles)} needs more {engine.replace('_', ' ')} "
                f"than one {model.key} has ({getattr(full, engine)})"
            )
    layout = place(0, [])
    if layout is None:
        raise InventoryError(
            f"bad GPU profile: MIG {'/'.join(mig.profiles)} does not fit on one {model.key} "
            f"(it has {table.memory_slices} memory slices; valid layouts are in NVIDIA's MIG user guide)"
        )
    return tuple(
        MigInstance(
            uuid=simulated_mig_uuid(gpu.uuid, profile.name, start),
            parent_uuid=gpu.uuid,
            profile=profile.name,
            start=start,
            size=profile.memory_slices,
            gi_id=gi_id,
            ci_id=0,
            memory_bytes=profile_memory(profile, gpu),
        )
        for gi_id, (profile, start) in enumerate(sorted(layout, key=lambda ps: ps[1]), start=1)
    )


_CGROUP_LAYOUTS = {
    "dmem": CgroupLayout(v2=True, dmem=True),
    "misc": CgroupLayout(v2=True, dmem=False),
    "v1": CgroupLayout(v2=False, dmem=False),
}


@dataclass(frozen=True)
class NodeOptions:
    """Node facts a profile may set after the GPUs: `driver=615.71.09`, `cgroup=dmem|misc|v1`."""

    driver_version: str = SIMULATED_DRIVER_VERSION
    cgroup: CgroupLayout = _CGROUP_LAYOUTS["dmem"]


def split_options(profile: str) -> tuple[str, NodeOptions]:
    """The GPU part of a profile and its node options (`2xH100-80GB,driver=615.71.09`)."""
    gpus: list[str] = []
    driver, cgroup = SIMULATED_DRIVER_VERSION, _CGROUP_LAYOUTS["dmem"]
    for raw in profile.split(","):
        key, sep, value = raw.partition("=")
        if not sep or ":" in key:  # `1xH100-80GB:mig=1g.10gb*7` is a GPU with its MIG layout
            gpus.append(raw)
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "driver" and driver_major(value) is not None:
            driver = value
        elif key == "cgroup" and value.lower() in _CGROUP_LAYOUTS:
            cgroup = _CGROUP_LAYOUTS[value.lower()]
        else:
            raise InventoryError(
                f"bad GPU profile {profile!r}: option {raw.strip()!r} is not driver=VERSION (e.g. "
                f"driver=615.71.09) or cgroup=dmem|misc|v1"
            )
    return ",".join(gpus), NodeOptions(driver, cgroup)


def simulated_uuid(seed: str, index: int, model: GpuModel) -> str:
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{seed}/{index}/{model.key}')}"


def simulated_pci_bus_id(index: int) -> str:
    domain, slot = divmod(index, len(_PCI_BUSES))
    return f"{domain:04x}:{_PCI_BUSES[slot]:02x}:00.0"


def _with_mig(gpu: GpuInfo, model: GpuModel, mig: SimulatedMig | None, caps: Capabilities) -> GpuInfo:
    gpu = with_capabilities(gpu, caps)
    if mig is None:
        return gpu
    instances = simulated_instances(gpu, model, mig)
    return replace(gpu, mig_enabled=True, mig_instances=instances, mig_dynamic=not instances)


class SimulatedInventory:
    """GPUs from a profile; set_health() stands in for NVML's health signals in tests and demos."""

    backend = "simulated"

    def __init__(self, profile: str, seed: str = "", hook_problem: str = "") -> None:
        self.profile = profile
        self.seed = seed
        gpu_profile, options = split_options(profile)
        self.options = options
        self._lock = threading.Condition()
        self._changes = 0
        self._seen = 0
        caps = detect(options.driver_version, options.cgroup, mig_enabled=False, hook_problem=hook_problem)
        mig_caps = detect(options.driver_version, options.cgroup, mig_enabled=True, hook_problem=hook_problem)
        self._gpus = [
            _with_mig(
                GpuInfo(
                    index=i,
                    minor=i,
                    uuid=simulated_uuid(seed, i, model),
                    product_name=model.product_name,
                    architecture=model.architecture,
                    cuda_compute_capability=model.compute_capability,
                    memory_bytes=model.memory_bytes,
                    driver_version=options.driver_version,
                    cuda_driver_version=SIMULATED_CUDA_VERSION,
                    pci_bus_id=simulated_pci_bus_id(i),
                    mig_capable=model.mig_capable,
                ),
                model,
                mig,
                mig_caps if mig else caps,
            )
            for i, (model, mig) in enumerate(parse_gpus(gpu_profile))
        ]

    def gpus(self) -> list[GpuInfo]:
        with self._lock:
            return list(self._gpus)

    def refresh_health(self) -> list[GpuInfo]:
        with self._lock:
            self._seen = self._changes
            return list(self._gpus)

    def wait_health_event(self, timeout_s: float) -> bool:
        """True once set_health() has changed something since the last refresh_health()."""
        with self._lock:
            return self._lock.wait_for(lambda: self._changes != self._seen, timeout=max(timeout_s, 0.0))

    def set_health(self, index: int, healthy: bool, reason: str = "") -> None:
        """Mark a GPU unhealthy (with a reason, e.g. "XID 79: GPU has fallen off the bus") or healthy again."""
        with self._lock:
            if not 0 <= index < len(self._gpus):
                raise InventoryError(
                    f"no simulated GPU with index {index}: this node has {len(self._gpus)} "
                    f"(indexes 0 to {len(self._gpus) - 1})"
                )
            if not healthy and not reason:
                reason = "marked unhealthy"
            gpu = self._gpus[index]
            updated = replace(gpu, healthy=healthy, health_reason="" if healthy else reason)
            if updated != gpu:
                self._gpus[index] = updated
                self._changes += 1
                self._lock.notify_all()

    def close(self) -> None:
        with self._lock:
            self._lock.notify_all()
