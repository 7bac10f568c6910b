"""MIG instances through nvidia-smi (its output as the tool prints it, from a stand-in runner) and
through the simulated table, which refuses what the driver refuses."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from dra_gpu.host.gpu_commands import CommandError
from dra_gpu.host.mig_commands import parse_mig_minors, simulated_mig_minors
from dra_gpu.host.nvidia import NvidiaCommands
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.inventory.mig_profiles import MIG_TABLES, MigProfile

GPU = SimulatedInventory("1xH100-80GB:mig", seed="n").gpus()[0]
A100 = SimulatedInventory("1xA100-40GB:mig", seed="n").gpus()[0]
H100 = MIG_TABLES["H100-80GB"]

CREATED = (
    "Successfully created GPU instance ID  2 on GPU  0 using profile MIG 3g.40gb (ID  9)\n"
    "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  2 using profile MIG 3g.40gb (ID  2)\n"
)
LIST_BEFORE = f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {GPU.uuid})\n"
LIST_AFTER = LIST_BEFORE + "  MIG 3g.40gb     Device  0: (UUID: MIG-0c1d2e3f-4a5b-5c6d-8e7f-901a2b3c4d5e)\n"
LGI = """\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 3g.40gb          9        2          4:4     |
+-------------------------------------------------------+
"""


def profile(name: str) -> MigProfile:
    found = H100.find(name)
    assert found is not None
    return found


class Runner:
    def __init__(self) -> None:
        self.argvs: list[list[str]] = []
        self.listed = 0

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.argvs.append(argv)
        out = ""
        if argv[1] == "-L":
            out = LIST_BEFORE if self.listed == 0 else LIST_AFTER
            self.listed += 1
        elif "-cgi" in argv:
            out = CREATED
        elif "-lgi" in argv:
            out = LGI
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_create_runs_cgi_with_profile_id_and_start_and_finds_the_new_uuid() -> None:
    runner = Runner()
    made = NvidiaCommands(nvidia_smi="nvidia-smi", runner=runner).create_mig_instance(
        GPU, profile("3g.40gb"), 4
    )
    assert ["nvidia-smi", "mig", "-i", GPU.uuid, "-cgi", "9:4", "-C"] in runner.argvs
    assert (made.uuid, made.gi_id, made.ci_id, made.start, made.size) == (
        "MIG-0c1d2e3f-4a5b-5c6d-8e7f-901a2b3c4d5e",
        2,
        0,
        4,
        4,
    )


def test_destroy_removes_the_compute_instance_then_the_gpu_instance() -> None:
    runner = Runner()
    commands = NvidiaCommands(nvidia_smi="nvidia-smi", runner=runner)
    (listed,) = commands.mig_instances(GPU)
    assert (listed.profile, listed.start, listed.gi_id) == ("3g.40gb", 4, 2)
    commands.destroy_mig_instance(GPU, listed)
    assert runner.argvs[-2:] == [
        ["nvidia-smi", "mig", "-i", GPU.uuid, "-gi", "2", "-ci", "0", "-dci"],
        ["nvidia-smi", "mig", "-i", GPU.uuid, "-gi", "2", "-dgi"],
    ]


def test_the_simulated_minors_file_numbers_capabilities_as_the_driver_does() -> None:
    minors = parse_mig_minors(simulated_mig_minors())
    assert (minors["config"], minors["monitor"], minors["gpu0/gi0/access"]) == (1, 2, 3)
    assert (minors["gpu0/gi1/access"], minors["gpu0/gi1/ci0/access"], minors["gpu1/gi0/access"]) == (
        12,
        13,
        138,
    )


@pytest.mark.parametrize(
    ("gpu", "name", "start", "refusal"),
    [
        (GPU, "3g.40gb", 2, "cannot start at memory slice 2"),
        (A100, "3g.40gb", 0, "has no MIG profile 3g.40gb"),
    ],
)
def test_the_simulated_table_refuses_what_the_driver_refuses(gpu, name, start, refusal) -> None:
    with pytest.raises(CommandError, match=refusal):
        SimulatedCommands().create_mig_instance(gpu, profile(name), start)


def test_the_simulated_table_refuses_overlaps_and_destroying_an_instance_in_use() -> None:
    commands = SimulatedCommands()
    made = commands.create_mig_instance(GPU, profile("4g.40gb"), 0)
    with pytest.raises(CommandError, match="overlaps instance"):
        commands.create_mig_instance(GPU, profile("1g.10gb"), 3)
    commands.set_mig_in_use(made.uuid, True)
    with pytest.raises(CommandError, match="in use by another client"):
        commands.destroy_mig_instance(GPU, made)
    commands.set_mig_in_use(made.uuid, False)
    commands.destroy_mig_instance(GPU, made)
    assert commands.mig_instances(GPU) == []
    again = commands.create_mig_instance(GPU, profile("4g.40gb"), 0)
    assert again.uuid != made.uuid, "a re-created instance has a new UUID"
