"""A call's work is proportional to its claims, not to the claims the node already has: the checkpoint is
neither copied nor rewritten as a whole per call. What a prepare costs in time with N claims prepared is
a benchmark's figure (`bench/prepare.py --prepared N`), not a test's."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from plugin_harness import NODE, Alloc, PluginDirs, add_claim, gpu_config, opaque, running_plugin, uid_of

from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin import KubeletPlugin
from dra_gpu.plugin.sharing.plan import ClaimInfo

PROFILE = "8xH100-80GB"
KEPT = 300


def claim(api: FakeKube, name: str, n: int, memory: str = "1Gi", cores: str = "1") -> ClaimInfo:
    obj = add_claim(
        api,
        name,
        [
            Alloc(
                device=f"gpu-{n % 8}",
                share_id=f"2e000000-0000-4000-8000-{n:012d}",
                consumed={"memory": memory, "cores": cores},
            )
        ],
        [opaque(gpu_config("Limiter"))],
    )
    return ClaimInfo(uid=uid_of(obj), namespace="default", name=name)


class Measured:
    """Per prepare+unprepare of one claim: bytes written to the checkpoint, deep copies."""

    def __init__(self, plugin: KubeletPlugin, one: ClaimInfo) -> None:
        self.plugin, self.one = plugin, one

    def written(self) -> int:
        store = self.plugin.preparer.core.store
        return sum(p.stat().st_size for p in (store.path, store.journal_path) if p.exists())

    def cycle(self) -> None:
        preparer = self.plugin.preparer
        assert preparer.prepare([self.one])[self.one.uid].error == ""
        assert preparer.unprepare([self.one]) == {self.one.uid: ""}

    def bytes_and_copies(self, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
        self.plugin.preparer.close()  # both from a fresh snapshot, no journal
        copies = [0]
        real = copy.deepcopy

        def counting(x: Any, memo: Any = None, _nil: Any = []) -> Any:  # noqa: B006 (copy's own signature)
            copies[0] += 1
            return real(x, memo, _nil)

        before = self.written()
        with monkeypatch.context() as m:
            m.setattr(copy, "deepcopy", counting)
            self.cycle()
        return self.written() - before, copies[0]


@pytest.fixture
def node() -> Iterator[tuple[PluginDirs, FakeKube]]:
    dirs = PluginDirs.create()
    yield dirs, FakeKube()
    dirs.cleanup()


@pytest.mark.slow
def test_a_prepare_writes_and_copies_the_same_with_300_claims_prepared(
    node: tuple[PluginDirs, FakeKube], monkeypatch: pytest.MonkeyPatch
) -> None:
    dirs, api = node
    one = claim(api, "measured", 10_000, "2Gi", "5")
    kept = [claim(api, f"kept-{i:03d}", i) for i in range(KEPT)]
    inventory = SimulatedInventory(PROFILE, seed=NODE)
    with running_plugin(
        dirs, api, inventory=inventory, stale_claim_interval_s=3600, monitor_interval_s=0
    ) as plugin:
        measured = Measured(plugin.plugin, one)
        measured.cycle()  # warm
        empty_bytes, empty_copies = measured.bytes_and_copies(monkeypatch)

        for first in range(0, KEPT, 50):
            results = plugin.plugin.preparer.prepare(kept[first : first + 50])
            assert all(r.error == "" for r in results.values())
        full_bytes, full_copies = measured.bytes_and_copies(monkeypatch)

    assert full_bytes == empty_bytes, "the checkpoint is appended to, not rewritten"
    assert full_copies == empty_copies, "nothing of the other claims is copied"
