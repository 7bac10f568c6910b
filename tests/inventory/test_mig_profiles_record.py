"""The MIG profile table against what a real H200's driver listed (tests/fixtures/mig/README.md)."""

from __future__ import annotations

import re

from repo_paths import TESTS

from dra_gpu.inventory.mig_profiles import MIG_TABLES

RECORD = TESTS / "fixtures" / "mig"

# "|   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |" then
# "|                                                               1     1     0   |" (CE, JPEG, OFA)
_ROW = re.compile(r"\|\s+\d+\s+MIG (\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+\w+\s+(\d+)\s+(\d+)\s+(\d+)\s+\|")
_ENGINES = re.compile(r"\|\s+(\d+)\s+(\d+)\s+(\d+)\s+\|")
_PLACEMENTS = re.compile(r"Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)")


def listed_profiles() -> dict[str, dict[str, int]]:
    lines = (RECORD / "h200-lgip.txt").read_text().splitlines()
    out: dict[str, dict[str, int]] = {}
    for i, line in enumerate(lines):
        row = _ROW.match(line)
        if not row:
            continue
        engines = _ENGINES.match(lines[i + 1])
        assert engines, f"no engine line after {line!r}"
        name, pid, _free, total, _gib, sms, dec, _enc = row.groups()
        ce, jpeg, ofa = engines.groups()
        out[name] = {
            "id": int(pid),
            "instances": int(total),
            "sms": int(sms),
            "dec": int(dec),
            "ce": int(ce),
            "jpeg": int(jpeg),
            "ofa": int(ofa),
        }
    return out


def listed_placements() -> dict[int, tuple[tuple[int, ...], int]]:
    text = (RECORD / "h200-lgipp.txt").read_text()
    return {
        int(pid): (tuple(int(s) for s in starts.split(",")), int(size))
        for pid, starts, size in _PLACEMENTS.findall(text)
    }


def test_the_h200_table_names_the_profiles_the_driver_lists() -> None:
    table = MIG_TABLES["H200-141GB"]
    assert sorted(p.name for p in table.profiles) == sorted(listed_profiles())


def test_each_h200_profile_has_the_drivers_id_and_engines() -> None:
    table = MIG_TABLES["H200-141GB"]
    for name, listed in listed_profiles().items():
        profile = table.find(name)
        assert profile is not None, name
        got = {
            "id": profile.profile_id,
            "dec": profile.decoders,
            "ce": profile.copy_engines,
            "jpeg": profile.jpeg_decoders,
            "ofa": profile.ofa,
        }
        assert got == {k: listed[k] for k in got}, name


def test_each_h200_profile_is_placed_where_the_driver_places_it() -> None:
    table = MIG_TABLES["H200-141GB"]
    placements = listed_placements()
    assert len(placements) == len(table.profiles)
    for profile in table.profiles:
        assert placements[profile.profile_id] == (profile.starts, profile.memory_slices), profile.name


def test_the_nvml_record_agrees_with_nvidia_smi() -> None:
    """The two records of one GPU say the same: a check on the parser as much as on the record."""
    by_id = {v["id"]: v for v in listed_profiles().values()}
    seen = 0
    for line in (RECORD / "h200-nvml-profiles.txt").read_text().splitlines():
        _, _index, ret, pid, slices, instances, sms, ce, _mib = line.split()
        if ret != "0":
            continue
        seen += 1
        listed = by_id[int(pid)]
        assert (listed["instances"], listed["sms"], listed["ce"]) == (int(instances), int(sms), int(ce))
        assert 1 <= int(slices) <= 7
    assert seen == len(by_id)


def test_the_h200_table_carries_the_memory_nvml_reports() -> None:
    table = MIG_TABLES["H200-141GB"]
    for line in (RECORD / "h200-nvml-profiles.txt").read_text().splitlines():
        _, _index, ret, pid, *_rest, mib = line.split()
        if ret == "0":
            profile = next(p for p in table.profiles if p.profile_id == int(pid))
            assert profile.memory_mib == int(mib), profile.name
