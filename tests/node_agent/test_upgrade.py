"""An upgrade from the previous release to this one and a rollback, on one node, under running tenants
(`upgrade_harness`, docs/upgrades.md): no tenant restarted, no call of the kubelet unanswered, every claim
prepared by one release unprepared by the other with nothing left behind, caps unchanged, new claims prepared."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from upgrade_harness import Figures, Unavailable, Upgrade, previous_release, this_release

pytestmark = [pytest.mark.limiter, pytest.mark.slow]


@pytest.fixture(scope="module")
def figures(built: Path) -> Iterator[Figures]:
    try:
        previous = previous_release()
    except Unavailable as exc:
        pytest.skip(str(exc))
    upgrade = Upgrade(previous, this_release(built), built)
    try:
        yield upgrade.run()
    finally:
        upgrade.close()


@pytest.mark.parametrize("direction", ["upgrade", "rollback"])
def test_tenants_keep_running_with_their_caps_and_every_claim_is_undone_by_the_other_release(
    figures: Figures, direction: str
) -> None:
    step = next(s for s in figures.steps if s.name == direction)
    assert step.tenants_before == step.tenants_after == 1, "a tenant was restarted or died"
    assert step.unanswered == [], "the kubelet's calls went unanswered while the agents changed"
    assert step.cap_after == step.cap_before > 0, "the claim's cap changed under its tenant"
    assert step.specs_unchanged, "the CDI specs of running claims changed"
    assert step.gpu_settings_unchanged, "the new agent remade or reset what the old one set up on the GPUs"
    assert step.claims_unprepared_after == step.claims_prepared_before == 4
    assert step.new_claims_prepared == 4
    assert step.left_behind == []
