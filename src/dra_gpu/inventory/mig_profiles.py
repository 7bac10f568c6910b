"""MIG GPU-instance profiles per GPU model, from NVIDIA's MIG user guide ("Supported MIG Profiles").

A profile occupies `memory_slices` consecutive memory slices (of 8) starting at one of its valid
`starts`; NVML refuses a placement that is not in that list or that overlaps an existing instance,
so the table is what the publisher offers and what the simulated GPU accepts. Engines (copy
engines, NVDEC, NVJPG, OFA) are the counts the guide lists per profile; a GPU's totals are those of
its full (7g) profile. Memory per instance is the profile's share of the GPU's memory (slices / 8),
which the real NVML backend replaces with what the driver reports.
"""

from __future__ import annotations

from dataclasses import dataclass

MEMORY_SLICES = 8
"""Every MIG-capable model here divides its memory into 8 slices (placements are counted in them)."""
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    name: str
    """As nvidia-smi prints it without the `MIG ` prefix: `1g.10gb`, `1g.10gb+me`."""
    profile_id: int
    """The GPU-instance profile id `nvidia-smi mig -lgip` lists (what `-cgi` also accepts)."""
    compute_slices: int
    memory_slices: int
    copy_engines: int
    decoders: int
    jpeg_decoders: int
    ofa: int
    starts: tuple[int, ...]
    """Valid placement starts, in memory slices; every placement is `memory_slices` long."""

    def placements(self) -> list[tuple[int, int]]:
        return [(start, self.memory_slices) for start in self.starts]


@dataclass(frozen=True)
class MigTable:
    model: str
    profiles: tuple[MigProfile, ...]

    @property
    def full(self) -> MigProfile:
        """The 7g profile: its engines are the whole GPU's."""
        return max(self.profiles, key=lambda p: (p.compute_slices, p.memory_slices))

    def find(self, name: str) -> MigProfile | None:
        wanted = name.strip().lower().removeprefix("mig ")
        return next((p for p in self.profiles if p.name == wanted), None)

    def names(self) -> str:
        return ", ".join(p.name for p in self.profiles)


def _ampere(mem: tuple[int, int, int, int, int]) -> tuple[MigProfile, ...]:
    """A100 40GB / 80GB: the same geometry, memory in the names differs (1g, 2x1g, 2g, 4g, full)."""
    one, one_big, two, four, full = mem
    return (
        MigProfile(f"1g.{one}gb", 19, 1, 1, 1, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{one}gb+me", 20, 1, 1, 1, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{one_big}gb", 15, 1, 2, 1, 1, 0, 0, (0, 2, 4, 6)),
        MigProfile(f"2g.{two}gb", 14, 2, 2, 2, 1, 0, 0, (0, 2, 4)),
        MigProfile(f"3g.{four}gb", 9, 3, 4, 3, 2, 0, 0, (0, 4)),
        MigProfile(f"4g.{four}gb", 5, 4, 4, 4, 2, 0, 0, (0,)),
        MigProfile(f"7g.{full}gb", 0, 7, 8, 7, 5, 1, 1, (0,)),
    )


def _hopper(mem: tuple[int, int, int, int, int]) -> tuple[MigProfile, ...]:
    """H100 80GB / H200 141GB: Hopper has an NVDEC and an NVJPG per compute slice."""
    one, one_big, two, four, full = mem
    return (
        MigProfile(f"1g.{one}gb", 19, 1, 1, 1, 1, 1, 0, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{one}gb+me", 20, 1, 1, 1, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{one_big}gb", 15, 1, 2, 1, 1, 1, 0, (0, 2, 4, 6)),
        MigProfile(f"2g.{two}gb", 14, 2, 2, 2, 2, 2, 0, (0, 2, 4)),
        MigProfile(f"3g.{four}gb", 9, 3, 4, 3, 3, 3, 0, (0, 4)),
        MigProfile(f"4g.{four}gb", 5, 4, 4, 4, 4, 4, 0, (0,)),
        MigProfile(f"7g.{full}gb", 0, 7, 8, 8, 7, 7, 1, (0,)),
    )


MIG_TABLES: dict[str, MigTable] = {
    t.model: t
    for t in (
        MigTable("A100-40GB", _ampere((5, 10, 10, 20, 40))),
        MigTable("A100-80GB", _ampere((10, 20, 20, 40, 80))),
        MigTable("H100-80GB", _hopper((10, 20, 20, 40, 80))),
        MigTable("H200-141GB", _hopper((18, 35, 35, 71, 141))),
    )
}

_PRODUCT_KEYS = (
    ("H200", "H200-141GB"),
    ("H100", "H100-80GB"),
    ("A100", None),  # 40 or 80 GB: decided by the memory size
)


def table_for(product_name: str, memory_bytes: int) -> MigTable | None:
    """The profile table of a GPU as NVML names it (`NVIDIA H100 80GB HBM3`), or None if unknown."""
    for marker, key in _PRODUCT_KEYS:
        if marker in product_name.upper():
            if key is None:
                key = "A100-80GB" if memory_bytes > 48 * 2**30 else "A100-40GB"
            return MIG_TABLES[key]
    return None


def profile_memory(profile: MigProfile, gpu_memory_bytes: int) -> int:
    """An instance's memory: its share of the GPU's, in whole MiB."""
    mib = 2**20
    return (gpu_memory_bytes * profile.memory_slices // MEMORY_SLICES) // mib * mib
