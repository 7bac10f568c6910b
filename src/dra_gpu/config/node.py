"""The node agent's `--sharing` setting: what each GPU of the node may host."""

from __future__ import annotations

from enum import StrEnum

from dra_gpu.config.base import ConfigError


class GpuSharingMode(StrEnum):
    """What a GPU on this node may host; published as the device attribute `sharing`.

    `Shared` GPUs host limiter and time-sliced shares side by side (both run in the default compute
    mode); `MPS` GPUs run an MPS control daemon in exclusive-process mode and host only MPS shares;
    `Exclusive` GPUs are never shared; they are the only ones whole-GPU (`Exclusive` class) claims get,
    so that a whole-GPU claim and a share never meet on one GPU.
    """

    EXCLUSIVE = "Exclusive"
    SHARED = "Shared"
    MPS = "MPS"


class NodeSharing:
    """Per-GPU sharing modes parsed from `--sharing` such as `*=Shared,0=MPS,GPU-1234...=Exclusive`."""

    def __init__(self, default: GpuSharingMode, by_key: dict[str, GpuSharingMode]) -> None:
        self.default = default
        self.by_key = by_key

    @classmethod
    def parse(cls, text: str) -> NodeSharing:
        default = GpuSharingMode.SHARED
        by_key: dict[str, GpuSharingMode] = {}
        allowed = ", ".join(m.value for m in GpuSharingMode)
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                key, value = "*", item
            key, value = key.strip(), value.strip()
            match = {m.value.lower(): m for m in GpuSharingMode}.get(value.lower())
            if match is None:
                raise ConfigError(f"--sharing: {item!r}: unknown mode {value!r}; allowed: {allowed}")
            if key == "*":
                default = match
            elif key.isdigit() or key.startswith("GPU-"):
                by_key[key] = match
            else:
                raise ConfigError(
                    f"--sharing: {item!r}: the key must be '*', a GPU index or a GPU UUID (GPU-...)"
                )
        return cls(default, by_key)

    def mode_for(self, index: int, uuid: str) -> GpuSharingMode:
        return self.by_key.get(uuid) or self.by_key.get(str(index)) or self.default

    def __str__(self) -> str:
        parts = [f"*={self.default.value}"] + [f"{k}={v.value}" for k, v in sorted(self.by_key.items())]
        return ",".join(parts)
