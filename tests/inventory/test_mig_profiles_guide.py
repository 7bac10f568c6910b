"""The MIG profile tables against NVIDIA's Multi-Instance GPU User Guide, "Supported MIG Profiles".

The rows below are the guide's tables (name, profile id, compute and memory slices, NVDEC/JPEG/OFA,
copy engines, how many instances of the profile fit) and its placement figures, written out once
so that the module's tables, which build them from shared shapes, are checked against the source
row by row; and the instance counts are checked as the placements and engines allow them.
"""

from __future__ import annotations

import pytest

from dra_gpu.inventory.mig import overlaps
from dra_gpu.inventory.mig_profiles import MIG_TABLES, MigProfile, MigTable, table_for

# name, id, compute slices, memory slices, NVDEC, JPEG, OFA, copy engines, instances, starts
Row = tuple[str, int, int, int, int, int, int, int, int, tuple[int, ...]]
ONE = (0, 1, 2, 3, 4, 5, 6)


def ampere(m: tuple[str, str, str, str, str]) -> list[Row]:
    one, one_big, two, four, full = m
    return [
        (f"1g.{one}gb", 19, 1, 1, 0, 0, 0, 1, 7, ONE),
        (f"1g.{one}gb+me", 20, 1, 1, 1, 1, 1, 1, 1, ONE),
        (f"1g.{one_big}gb", 15, 1, 2, 1, 0, 0, 1, 4, (0, 2, 4, 6)),
        (f"2g.{two}gb", 14, 2, 2, 1, 0, 0, 2, 3, (0, 2, 4)),
        (f"3g.{four}gb", 9, 3, 4, 2, 0, 0, 3, 2, (0, 4)),
        (f"4g.{four}gb", 5, 4, 4, 2, 0, 0, 4, 1, (0,)),
        (f"7g.{full}gb", 0, 7, 8, 5, 1, 1, 7, 1, (0,)),
    ]


def hopper(m: tuple[str, str, str, str, str]) -> list[Row]:
    one, one_big, two, four, full = m
    return [
        (f"1g.{one}gb", 19, 1, 1, 1, 1, 0, 1, 7, ONE),
        (f"1g.{one}gb+me", 20, 1, 1, 1, 1, 1, 1, 1, ONE),
        (f"1g.{one_big}gb", 15, 1, 2, 1, 1, 0, 1, 4, (0, 2, 4, 6)),
        (f"2g.{two}gb", 14, 2, 2, 2, 2, 0, 2, 3, (0, 2, 4)),
        (f"3g.{four}gb", 9, 3, 4, 3, 3, 0, 3, 2, (0, 4)),
        (f"4g.{four}gb", 5, 4, 4, 4, 4, 0, 4, 1, (0,)),
        (f"7g.{full}gb", 0, 7, 8, 7, 7, 1, 8, 1, (0,)),
    ]


GUIDE: dict[str, list[Row]] = {
    "A100-40GB": ampere(("5", "10", "10", "20", "40")),
    "A100-80GB": ampere(("10", "20", "20", "40", "80")),
    "H100-80GB": hopper(("10", "20", "20", "40", "80")),
    "H200-141GB": hopper(("18", "35", "35", "71", "141")),
    "B200-180GB": hopper(("23", "45", "45", "90", "180")),  # the guide's "B200 MIG Profiles": Hopper's shape
    "A30-24GB": [  # "A30 MIG Profiles": 4 memory and compute slices
        ("1g.6gb", 14, 1, 1, 0, 0, 0, 1, 4, (0, 1, 2, 3)),
        ("1g.6gb+me", 21, 1, 1, 1, 1, 1, 1, 1, (0, 1, 2, 3)),
        ("2g.12gb", 5, 2, 2, 2, 0, 0, 2, 2, (0, 2)),
        ("2g.12gb+me", 6, 2, 2, 2, 1, 1, 2, 1, (0, 2)),
        ("4g.24gb", 0, 4, 4, 4, 1, 1, 4, 1, (0,)),
    ],
}


def row_of(p: MigProfile) -> Row:
    return (
        p.name,
        p.profile_id,
        p.compute_slices,
        p.memory_slices,
        p.decoders,
        p.jpeg_decoders,
        p.ofa,
        p.copy_engines,
        most_instances(MIG_TABLES_BY_PROFILE[id(p)], p),
        p.starts,
    )


MIG_TABLES_BY_PROFILE = {id(p): t for t in MIG_TABLES.values() for p in t.profiles}


def most_instances(table: MigTable, profile: MigProfile) -> int:
    """How many instances of one profile fit at once: placements that do not overlap, engines permitting."""
    full = table.full
    engines = ("compute_slices", "copy_engines", "decoders", "jpeg_decoders", "ofa")

    def fits(n: int) -> bool:
        return all(n * getattr(profile, e) <= getattr(full, e) for e in engines)

    best = 0

    def place(i: int, taken: list[int]) -> None:
        nonlocal best
        if fits(len(taken)):
            best = max(best, len(taken))
        for k in range(i, len(profile.starts)):
            start = profile.starts[k]
            span = (start, profile.memory_slices)
            if not any(overlaps(span, (s, profile.memory_slices)) for s in taken) and fits(len(taken) + 1):
                place(k + 1, [*taken, start])

    place(0, [])
    return best


@pytest.mark.parametrize("model", sorted(GUIDE))
def test_each_table_is_the_guides(model: str) -> None:
    assert [row_of(p) for p in MIG_TABLES[model].profiles] == GUIDE[model]


def test_the_tables_are_those_the_guide_has() -> None:
    assert set(MIG_TABLES) == set(GUIDE)


@pytest.mark.parametrize(
    ("name", "gib", "model"),
    [
        ("NVIDIA A100-SXM4-40GB", 39.6, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", 39.6, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 79.2, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", 79.6, "H100-80GB"),
        ("NVIDIA H100 PCIe", 79.6, "H100-80GB"),
        ("NVIDIA H200", 140.4, "H200-141GB"),
        ("NVIDIA H200 NVL", 140.4, "H200-141GB"),
        ("NVIDIA H100 NVL", 93.6, None),  # 1g.12gb ...: not the 80GB table
        ("NVIDIA GH200 480GB", 95.0, None),
        ("NVIDIA GH200 144G HBM3e", 140.4, None),
        ("NVIDIA H20", 95.0, None),
        ("NVIDIA A30", 24.0, "A30-24GB"),
        ("NVIDIA B200", 178.4, "B200-180GB"),
        ("NVIDIA GB200", 184.0, None),  # 186GB: other sizes than the B200's
        ("NVIDIA L4", 22.5, None),
    ],
)
def test_a_board_gets_its_table_by_name_and_memory(name: str, gib: float, model: str | None) -> None:
    table = table_for(name, int(gib * 2**30))
    assert (table.model if table else None) == model
