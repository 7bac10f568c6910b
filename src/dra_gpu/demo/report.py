"""Plain-text tables for the demo: who holds which share of each GPU, and what each container gets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from cdi.resolver import ContainerConfig
from dra_gpu.quantity import QuantityError, format_quantity, parse_quantity
from dra_gpu.text import gib, render_table, share_text

__all__ = ["gib", "render_table", "share_text"]

SHOWN_ENV_PREFIXES = ("NVIDIA_", "CUDA_", "LD_PRELOAD", "DRAGPU_")


def _amount(text: str) -> Fraction:
    try:
        return parse_quantity(text)
    except QuantityError:
        return Fraction(0)


@dataclass
class GpuHolder:
    claim: str
    strategy: str
    share: str
    consumed: dict[str, str]
    pods: list[str]
    allocated_by: str


@dataclass
class GpuView:
    device: str
    uuid: str
    sharing: str
    memory: str
    cores: str
    holders: list[GpuHolder] = field(default_factory=list)

    def used(self) -> str:
        if not self.holders:
            return "free"
        if any(not h.consumed for h in self.holders):
            return "taken whole"
        memory = sum((_amount(h.consumed.get("memory", "0")) for h in self.holders), Fraction(0))
        cores = sum((_amount(h.consumed.get("cores", "0")) for h in self.holders), Fraction(0))
        return (
            f"{gib(memory)} of {gib(_amount(self.memory))} memory, "
            f"{format_quantity(cores)} of {self.cores} cores in use"
        )


def render_gpus(gpus: Sequence[GpuView]) -> str:
    blocks = []
    for gpu in gpus:
        head = f"{gpu.device}  {gpu.uuid}  GPU sharing mode {gpu.sharing}: {gpu.used()}"
        if not gpu.holders:
            blocks.append(head)
            continue
        rows = [(h.claim, h.strategy, h.share, ", ".join(h.pods) or "-", h.allocated_by) for h in gpu.holders]
        blocks.append(
            head
            + "\n"
            + render_table(("CLAIM", "MODE", "SHARE", "PODS", "ALLOCATED BY"), rows, indent="    ")
        )
    return "\n\n".join(blocks)


@dataclass
class ContainerView:
    pod: str
    claims: list[str]
    cdi_ids: list[str]
    env: dict[str, str]
    mounts: list[tuple[str, str, str]]  # container path, host path, options
    device_nodes: list[str]

    @classmethod
    def of(cls, pod: str, claims: list[str], cdi_ids: list[str], config: ContainerConfig) -> ContainerView:
        mounts = [(m.container_path, m.host_path, ",".join(m.options or [])) for m in config.mounts]
        nodes = [n.path for n in config.device_nodes]
        return cls(pod, claims, cdi_ids, dict(config.env), mounts, nodes)


def _env_line(key: str, value: str) -> str:
    if key.startswith("DRAGPU_MEMORY_LIMIT") and "=" not in value and value.isdigit():
        return f"{key}={value} ({format_quantity(int(value))})"
    return f"{key}={value}"


def render_containers(containers: Sequence[ContainerView]) -> str:
    """One block per distinct set of CDI devices (the pods of a shared claim get the same)."""
    groups: dict[tuple[str, ...], list[ContainerView]] = {}
    for c in containers:
        groups.setdefault(tuple(c.cdi_ids), []).append(c)
    blocks = []
    for members in groups.values():
        c = members[0]
        pods = ", ".join(m.pod for m in members)
        lines = [f"pod{'s' if len(members) > 1 else ''} {pods} (claims: {', '.join(c.claims)})"]
        lines.append(f"    CDI devices: {', '.join(c.cdi_ids)}")
        shown = sorted(k for k in c.env if k.startswith(SHOWN_ENV_PREFIXES))
        lines += [f"    env    {_env_line(k, c.env[k])}" for k in shown]
        lines += [f"    mount  {dst}  ({opts or 'rw'})" for dst, _src, opts in c.mounts]
        lines += [f"    device {n}" for n in c.device_nodes] or [
            "    device nodes: none (simulated GPUs have no /dev/nvidia*)"
        ]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)
