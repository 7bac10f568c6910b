"""MIG in the simulated backend: the profile tables and the `:mig` profile syntax a user types."""

from __future__ import annotations

import json

import pytest

from dra_gpu.cli import main
from dra_gpu.inventory.mig_profiles import MIG_TABLES, table_for
from dra_gpu.inventory.simulated import SimulatedInventory
from dra_gpu.inventory.types import InventoryError


def test_each_table_has_the_guides_profiles_and_placements() -> None:
    h100 = MIG_TABLES["H100-80GB"]
    assert [p.name for p in h100.profiles] == [
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"
    ]  # fmt: skip
    assert h100.find("3g.40gb").placements() == [(0, 4), (4, 4)]  # type: ignore[union-attr]
    assert h100.find("1g.20gb").starts == (0, 2, 4, 6)  # type: ignore[union-attr]
    assert MIG_TABLES["A100-40GB"].find("1g.5gb") is not None
    assert MIG_TABLES["H200-141GB"].find("7g.141gb") is not None
    assert table_for("NVIDIA A100-SXM4-80GB", 80 * 2**30) is MIG_TABLES["A100-80GB"]
    assert table_for("NVIDIA L4", 24 * 2**30) is None


def test_mig_without_instances_is_a_dynamic_gpu() -> None:
    gpu = SimulatedInventory("1xH100-80GB:mig").gpus()[0]
    assert gpu.mig_enabled and gpu.mig_dynamic and gpu.mig_instances == ()


def test_static_instances_get_valid_disjoint_placements_and_stable_uuids() -> None:
    gpus = SimulatedInventory("1xH100-80GB:mig=1g.10gb*7", seed="node-a").gpus()
    instances = gpus[0].mig_instances
    assert [m.start for m in instances] == list(range(7))
    assert all(m.uuid.startswith("MIG-") and m.parent_uuid == gpus[0].uuid for m in instances)
    assert not gpus[0].mig_dynamic
    again = SimulatedInventory("1xH100-80GB:mig=1g.10gb*7", seed="node-a").gpus()[0].mig_instances
    assert [m.uuid for m in again] == [m.uuid for m in instances]


def test_a_layout_that_fits_only_one_way_is_found() -> None:
    gpu = SimulatedInventory("1xH100-80GB:mig=3g.40gb/1g.10gb*4").gpus()[0]
    assert [(m.profile, m.start) for m in gpu.mig_instances] == [
        ("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "says"),
    [
        ("1xH100-80GB:mig=3g.40gb*2/1g.10gb", "does not fit"),
        ("1xH100-80GB:mig=1g.10gb*8", "more compute slices"),
        ("1xH100-80GB:mig=1g.10gb+me*2", "more ofa"),
        ("1xL4-24GB:mig", "has no MIG profiles"),
        ("1xH100-80GB:mig=1g.5gb", "it has 1g.10gb"),
        ("1xH100-80GB:migs", "MODEL:mig"),
    ],
)
def test_layouts_the_gpu_refuses_are_refused(profile: str, says: str) -> None:
    with pytest.raises(InventoryError, match=says):
        SimulatedInventory(profile)


def test_gpus_command_shows_the_instances(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--simulate", "1xA100-40GB:mig=3g.20gb*2", "-o", "json"]) == 0
    (gpu,) = json.loads(capsys.readouterr().out)
    assert [(m["profile"], m["start"]) for m in gpu["migInstances"]] == [("3g.20gb", 0), ("3g.20gb", 4)]
    assert main(["gpus", "--simulate", "1xH100-80GB:mig=9g.1gb"]) == 2
    assert "no MIG profile '9g.1gb'" in capsys.readouterr().err
