"""MIG GPU-instance profiles per GPU model, as the NVIDIA Multi-Instance GPU User Guide lists them.

The tables follow the guide's chapter "Supported MIG Profiles": its "A100 MIG Profiles" table
(A100-SXM4-40GB; the 80GB names scale with the memory, as the guide says) and "H100 MIG Profiles"
and "H200 MIG Profiles" tables (profile names, memory and SM fractions, NVDEC/JPEG/OFA units, copy
engines, instance counts) with the placement figures beside them. Profile ids are those
`nvidia-smi mig -lgip` prints (the guide's chapter "Getting Started with MIG", "List GPU Instance
Profiles"). The H200 table is also checked against a real H200's listing (tests/fixtures/mig).
The guide's H100 and H200 tables are for the 80GB and 141GB boards only: an H100 NVL (94GB), an
H100 on GH200 (96GB) or a GH200's H200 have other memory sizes, so other names, and no table here.

A profile occupies `memory_slices` consecutive memory slices (of 8) starting at one of its valid
`starts`; NVML refuses a placement that is not in that list or that overlaps an existing instance,
so the table is what the publisher offers and what the simulated GPU accepts. Engines (copy
engines, NVDEC, NVJPG, OFA) are the counts the guide lists per profile; a GPU's totals are those of
its full (7g) profile. Memory per instance is what NVML's profile info reports (`memorySizeMB`):
a real node reads it from the driver (`GpuInfo.mig_profile_memory`); the tables carry the figures
real boards report (H200: tests/fixtures/mig; H100 80GB: `nvidia-smi mig -lgip`, in GiB to two
decimals) for simulated nodes, and fall back to the profile's share of the GPU's memory
(slices / 8) where no figure is recorded. The name rounds: an H200's `1g.18gb` has 16384 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dra_gpu.inventory.types import GpuInfo

MEMORY_SLICES = 8
"""Most MIG-capable models divide their memory into 8 slices (placements are counted in them); the A30 4."""
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
    memory_mib: int = 0
    """An instance's memory as NVML's profile info reports it on a real board; 0: not recorded."""

    def placements(self) -> list[tuple[int, int]]:
        return [(start, self.memory_slices) for start in self.starts]


@dataclass(frozen=True)
class MigTable:
    model: str
    profiles: tuple[MigProfile, ...]
    memory_slices: int = MEMORY_SLICES
    """Memory slices of the whole GPU: 8, or 4 on an A30."""

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


def _with_memory(profiles: tuple[MigProfile, ...], mib: dict[int, int]) -> tuple[MigProfile, ...]:
    """The profiles with NVML's memory per profile id."""
    return tuple(replace(p, memory_mib=mib[p.profile_id]) for p in profiles)


H100_80GB_MIB = {19: 9984, 20: 9984, 15: 20096, 14: 20096, 9: 40448, 5: 40448, 0: 81152}
"""`nvidia-smi mig -lgip` on an H100 80GB HBM3: 9.75, 19.62, 39.50 and 79.25 GiB. The two-slice profiles'
20096 MiB (19.62 GiB is 20086-20096 MiB) is also what `nvidia-smi` lists as a `2g.20gb` MIG device's memory on
an H100 80GB HBM3 (driver 535.104.12), beside `1g.10gb`'s 9984 MiB; `1g.20gb` has the same two memory slices.
Not a multiple of 256 MiB: a device published with its memory rounded down to 256 MiB shows 19968Mi."""
H200_141GB_MIB = {19: 16384, 20: 16384, 15: 33280, 14: 33280, 9: 71424, 5: 71424, 0: 143360}
"""NVML's profile info on an H200 (tests/fixtures/mig/h200-nvml-profiles.txt)."""


def _a30() -> tuple[MigProfile, ...]:
    """A30 24GB: four memory and compute slices; one `+me` profile of each size holds the JPEG and OFA."""
    return (
        MigProfile("1g.6gb", 14, 1, 1, 1, 0, 0, 0, (0, 1, 2, 3)),
        MigProfile("1g.6gb+me", 21, 1, 1, 1, 1, 1, 1, (0, 1, 2, 3)),
        MigProfile("2g.12gb", 5, 2, 2, 2, 2, 0, 0, (0, 2)),
        MigProfile("2g.12gb+me", 6, 2, 2, 2, 2, 1, 1, (0, 2)),
        MigProfile("4g.24gb", 0, 4, 4, 4, 4, 1, 1, (0,)),
    )


MIG_TABLES: dict[str, MigTable] = {
    t.model: t
    for t in (
        MigTable("A100-40GB", _ampere((5, 10, 10, 20, 40))),
        MigTable("A100-80GB", _ampere((10, 20, 20, 40, 80))),
        MigTable("H100-80GB", _with_memory(_hopper((10, 20, 20, 40, 80)), H100_80GB_MIB)),
        MigTable("H200-141GB", _with_memory(_hopper((18, 35, 35, 71, 141)), H200_141GB_MIB)),
        # B200: the names, memory and SM fractions and instance counts are those of the guide's B200 table.
        # Unconfirmed, taken from Hopper: the profile ids (no stored `nvidia-smi mig -lgip` of a B200 lists
        # them) and the engines; the guide's B200 table lists 2, 2, 2, 3, 6, 8 and 16 copy engines for
        # 1g.23gb, 1g.23gb+me, 1g.45gb, 2g.45gb, 3g.90gb, 4g.90gb and 7g.180gb (Hopper's here: 1, 1, 1, 2,
        # 3, 4, 8), and its NVDEC/JPEG/OFA columns are not read the same way as Hopper's. A real node reads
        # each profile's memory from NVML; its ids and engines should be checked against NVML before use.
        MigTable("B200-180GB", _hopper((23, 45, 45, 90, 180))),
        MigTable("A30-24GB", _a30(), memory_slices=4),
    )
}

_GIB = 2**30
_PRODUCT_KEYS = (
    ("B200", "B200-180GB", 170 * _GIB, 190 * _GIB),
    ("H200", "H200-141GB", 128 * _GIB, 148 * _GIB),
    ("H100", "H100-80GB", 72 * _GIB, 88 * _GIB),
    ("A100", "A100-80GB", 72 * _GIB, 88 * _GIB),
    ("A100", "A100-40GB", 36 * _GIB, 44 * _GIB),
    ("A30", "A30-24GB", 20 * _GIB, 28 * _GIB),
)
"""(name marker, table, memory range): NVML reports a little less than the board's nominal size."""


def table_for(product_name: str, memory_bytes: int) -> MigTable | None:
    """The profile table of a GPU as NVML names it (`NVIDIA H100 80GB HBM3`), or None if unknown.

    The memory decides between boards of one name: an H100 NVL (94GB) has profiles of other sizes
    than an H100 80GB, and a GH200 (whose name contains "H200") is not an H200.
    """
    name = product_name.upper()
    if "GH200" in name or "GB200" in name:  # other memory sizes than the boards of these tables
        return None
    for marker, key, low, high in _PRODUCT_KEYS:
        if marker in name and low <= memory_bytes < high:
            return MIG_TABLES[key]
    return None


def profile_memory(profile: MigProfile, gpu: GpuInfo) -> int:
    """An instance's memory in bytes: what the GPU's driver reports for the profile, else the table's
    figure for the board, else the profile's share of the GPU's memory in whole MiB."""
    mib = 2**20
    reported = dict(gpu.mig_profile_memory).get(profile.profile_id)
    if reported:
        return reported
    if profile.memory_mib:
        return profile.memory_mib * mib
    table = table_for(gpu.product_name, gpu.memory_bytes)
    slices = table.memory_slices if table else MEMORY_SLICES
    return (gpu.memory_bytes * profile.memory_slices // slices) // mib * mib
