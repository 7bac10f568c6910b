"""A sharing mode added the way CONTRIBUTING's recipe says, and nothing else: its `Strategy` value, its line
in `config/modes.py`'s `MODES`, its backend and hold handler in `plugin/sharing/`'s tables. Its claims are
then prepared with its backend's edits and holds, refused where it says, and unprepared, without any other
module knowing it (as `tests/devicekinds/test_device_kinds.py` adds a made-up device kind)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Set

import pytest
from plugin_harness import Alloc, add_claim, cdi_ids, gpu_config, opaque, resolve, running_plugin, uid_of

from dra_gpu.config import GpuSharingMode, Strategy
from dra_gpu.config import modes as config_modes
from dra_gpu.config.modes import SharingMode
from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin import sharing
from dra_gpu.plugin.checkpoint import Hold
from dra_gpu.plugin.sharing.plan import Backend, Holder, HoldHandler, NodeContext, Plan, Share

VALUE = "Metered"
ENV = "DRAGPU_METERED_GPU"


@pytest.fixture
def metered() -> Iterator[Strategy]:
    """`Strategy.METERED`, as if the enum had the line (an enum takes no member once made: this adds it
    for the test and takes it away after)."""
    member = str.__new__(Strategy, VALUE)
    member._name_, member._value_ = "METERED", VALUE
    Strategy._value2member_map_[VALUE] = member
    Strategy._member_map_["METERED"] = member
    Strategy._member_names_.append("METERED")
    try:
        yield member
    finally:
        Strategy._member_names_.remove("METERED")
        del Strategy._member_map_["METERED"]
        del Strategy._value2member_map_[VALUE]


class MeteredBackend:
    """The mode's backend: its shares get their GPU's UUID in the container and a meter on the node; a
    GPU takes at most `most` metered claims."""

    name = "metered"
    order = 50

    def __init__(self, strategy: Strategy, most: int) -> None:
        self.strategy = strategy
        self.most = most

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        if share.strategy is not self.strategy:
            return None
        on_gpu = [o for o in others if o.record.strategy == VALUE]
        return (
            f"GPU {share.gpu.uuid} has {len(on_gpu)} metered claims already"
            if len(on_gpu) >= self.most
            else None
        )

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        for share in plan.sharing(self.strategy):
            plan.edits(share).env[ENV] = share.gpu.uuid
            plan.hold("meter", f"meter:{share.gpu.uuid}:{plan.claim.uid}", gpu=share.gpu.uuid)


class Meters:
    """The mode's node-side setup: a meter per claim and GPU, here a set of keys."""

    kind = "meter"

    def __init__(self) -> None:
        self.on: set[str] = set()

    def apply(self, hold: Hold, node: NodeContext) -> None:
        self.on.add(hold.key)

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        self.on.discard(hold.key)

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        return hold.key in self.on

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        self.on &= set(held)


def test_a_mode_added_to_the_tables_is_prepared_through_them(
    metered: Strategy, dirs, api, kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend: Backend = MeteredBackend(metered, most=2)  # (mypy checks the two against the interfaces)
    meters = Meters()
    handler: HoldHandler = meters
    mode = SharingMode(metered, GpuSharingMode.SHARED, limits=frozenset(), beside=frozenset({metered}))
    monkeypatch.setattr(config_modes, "MODES", {**config_modes.MODES, metered: mode})
    monkeypatch.setattr(sharing, "BACKENDS", (*sharing.BACKENDS, backend))
    monkeypatch.setattr(sharing, "HOLD_HANDLERS", {**sharing.HOLD_HANDLERS, handler.kind: handler})
    dirs.make_device_nodes((0, 1))
    claims = [
        add_claim(api, f"metered-{n}", [Alloc(share_id=f"share-{n}")], [opaque(gpu_config(VALUE))])
        for n in range(3)
    ]
    with running_plugin(dirs, api):
        kubelet.register()
        first, second, third = (kubelet.prepare(claim)[uid_of(claim)] for claim in claims)
        assert (first.error, second.error) == ("", "")
        assert "has 2 metered claims already" in third.error
        container = resolve(dirs, cdi_ids(first))
        assert container.env[ENV].startswith("GPU-")
        assert meters.on == {f"meter:{container.env[ENV]}:{uid_of(c)}" for c in claims[:2]}

        assert kubelet.unprepare(claims[0]) == {uid_of(claims[0]): ""}
        assert meters.on == {f"meter:{container.env[ENV]}:{uid_of(claims[1])}"}
        assert config_modes.may_meet(VALUE, VALUE) and not config_modes.takes_whole_gpu(VALUE)
