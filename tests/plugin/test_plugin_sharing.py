"""How a claim's plan is assembled from the enforcement backends."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from plugin_harness import (
    NODE,
    PROFILE,
    Alloc,
    PluginDirs,
    add_claim,
    cdi_ids,
    gpu_config,
    opaque,
    registered_kubelet,
    resolve,
    two_shares,
    uid_of,
)

from dra_gpu.config import parse_gpu_config
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin import sharing
from dra_gpu.plugin.sharing.plan import ClaimInfo, NodeContext, Plan, Share

GPUS = SimulatedInventory(PROFILE, seed=NODE).gpus()


def share(position: int, strategy: str, **section: object) -> Share:
    return Share(
        position=position,
        request="gpu",
        pool=NODE,
        device="gpu-0",
        gpu=GPUS[0],
        share_id=f"00000000-0000-4000-8000-00000000000{position}",
        consumed={"memory": Fraction(1 << 30), "cores": Fraction(10)},
        admin_access=False,
        config=parse_gpu_config(gpu_config(strategy, **section)),
    )


@pytest.mark.parametrize("strategy", ["Exclusive", "TimeSlicing", "MPS", "Limiter"])
def test_every_hold_a_backend_asks_for_has_a_handler_to_undo_it_and_each_device_has_edits(
    tmp_path: Path, strategy: str
) -> None:
    library = tmp_path / "lib.so"
    library.write_text("")
    node = NodeContext("gpu.dra-gpu.io", tmp_path, library, tmp_path, SimulatedCommands())
    plan = Plan(
        claim=ClaimInfo("uid-1", "default", "c"), shares=[share(0, strategy)], driver="gpu.dra-gpu.io"
    )
    for backend in sharing.backends():
        backend.contribute(plan, node)
    assert {h.kind for h in plan.holds} <= set(sharing.hold_handlers())
    assert not plan.cdi_spec().devices[0].container_edits.is_empty(), "a device with no edits is invalid CDI"


def test_two_shares_of_one_gpu_in_one_claim_get_distinct_cdi_devices(dirs: PluginDirs) -> None:
    api = FakeKube()
    claim = add_claim(
        api,
        "two-shares",
        two_shares(),
        [opaque(gpu_config("Limiter"))],
    )
    with registered_kubelet(dirs, api) as (_, kubelet):
        response = kubelet.prepare(claim)[uid_of(claim)]
        ids = cdi_ids(response)
        assert ids == [
            f"gpu.dra-gpu.io/claim={uid_of(claim)}-gpu-0",
            f"gpu.dra-gpu.io/claim={uid_of(claim)}-gpu-0-00000000-0000-4000-8000-00000000000b",
        ]
        container = resolve(dirs, ids)
        del container  # both shares count against one limit: one line for the GPU
        limits = dirs.state_dir / "claims" / uid_of(claim) / "limits"
        assert limits.read_text().splitlines()[-1] == f"device={GPUS[0].uuid} memory={3 << 30} cores=15"


def test_conflicting_intervals_within_one_claim_name_the_request(dirs: PluginDirs) -> None:
    api = FakeKube()
    claim = add_claim(
        api,
        "mixed",
        [
            Alloc(request="a", share_id="00000000-0000-4000-8000-00000000000a"),
            Alloc(request="b", share_id="00000000-0000-4000-8000-00000000000b"),
        ],
        [
            opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Short"}), requests=["a"]),
            opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Long"}), requests=["b"]),
        ],
    )
    with registered_kubelet(dirs, api) as (_, kubelet):
        error = kubelet.prepare(claim)[uid_of(claim)].error
        assert (
            "is time-sliced with interval Short for claim default/mixed (request a); this claim asks for Long"
            in error
        )
