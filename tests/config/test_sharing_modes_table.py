"""Every sharing mode is declared once, in `config/modes.py`, and what reads the table agrees with it."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND
from dra_gpu.config import GpuConfig, GpuSharingMode, Strategy
from dra_gpu.config.modes import MODES, SHAREABLE_NODE_MODES, may_meet, shares_gpu
from dra_gpu.devicekinds.gpu import build_device
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.manifests.admission import validations
from dra_gpu.manifests.classes import CLASSES
from dra_gpu.manifests.values import load_values
from dra_gpu.plugin import sharing
from dra_gpu.plugin.checkpoint import ShareRecord
from dra_gpu.plugin.sharing.modes.timeslicing import CAP_DETAIL, DETAIL
from dra_gpu.plugin.sharing.plan import Holder, Share

GPU = SimulatedInventory("1xH100-80GB", seed="modes").gpus()[0]


def test_every_strategy_has_its_line_in_the_table() -> None:
    assert set(MODES) == set(Strategy), "declare the new mode in config/modes.py"
    assert all(mode.strategy is strategy for strategy, mode in MODES.items())


def test_every_node_setting_hosts_a_mode_and_its_modes_agree_on_sharing() -> None:
    for node_mode in GpuSharingMode:
        modes = [m for m in MODES.values() if m.node_mode is node_mode]
        assert modes, f"no mode runs on {node_mode.value} GPUs"
        assert len({shares_gpu(m) for m in modes}) == 1, f"{node_mode.value} GPUs are shared or not"
        assert (node_mode in SHAREABLE_NODE_MODES) == shares_gpu(modes[0])


def test_meeting_is_mutual_and_shares_of_a_shared_mode_meet_each_other() -> None:
    for a in Strategy:
        for b in Strategy:
            assert may_meet(a.value, b.value) == may_meet(b.value, a.value), (a, b)
        assert may_meet(a.value, a.value) == shares_gpu(MODES[a])
        # Modes that meet run on the same GPUs.
        assert all(MODES[b].node_mode is MODES[a].node_mode for b in MODES[a].beside)


def test_every_mode_has_a_device_class_that_selects_its_gpus() -> None:
    for strategy, mode in MODES.items():
        classes = [c for c in CLASSES if c.strategy is strategy]
        assert classes, f"give {strategy.value} a DeviceClass in manifests/classes.py"
        assert all(c.mode is mode.node_mode for c in classes)


def test_the_publisher_publishes_a_gpu_shareable_exactly_when_its_modes_share_it() -> None:
    for node_mode in GpuSharingMode:
        device = build_device(GPU, node_mode)
        shared = any(shares_gpu(m) for m in MODES.values() if m.node_mode is node_mode)
        assert bool(device.get("allowMultipleAllocations")) == shared, node_mode


def test_the_admission_policy_takes_capacity_requests_for_the_classes_of_shared_modes() -> None:
    capacity = validations(load_values())[0]["expression"]
    for spec in CLASSES:
        assert (f'"{spec.name}"' in capacity) == shares_gpu(MODES[spec.strategy]), spec.name


def _share(strategy: Strategy) -> Share:
    config = GpuConfig.model_validate(
        {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "sharing": {"strategy": strategy.value}}
    )
    consumed = {"memory": Fraction(2**30), "cores": Fraction(10)}
    return Share(0, "gpu", "pool", "gpu-0", GPU, "new", consumed, False, config)


def _holder(strategy: Strategy) -> Holder:
    detail = {DETAIL: "Default", CAP_DETAIL: str(2**30)}  # capped, same interval: nothing else conflicts
    record = ShareRecord(device="gpu-0", gpu=GPU.uuid, strategy=strategy.value, shareId="old", detail=detail)
    return Holder("ns/other", record)


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
@pytest.mark.parametrize("other", list(Strategy), ids=lambda s: s.value)
def test_prepare_lets_two_shares_meet_on_a_gpu_exactly_when_the_table_does(
    strategy: Strategy, other: Strategy
) -> None:
    share = _share(strategy)
    conflicts = [c for b in sharing.backends() if (c := b.conflict(share, [_holder(other)])) is not None]
    assert (conflicts == []) == may_meet(strategy.value, other.value), conflicts
