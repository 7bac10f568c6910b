"""An upgrade from the previous release to this one and a rollback, on one node, under running tenants
(`upgrade_harness`, docs/upgrades.md): no tenant restarted, no call of the kubelet unanswered, every claim
prepared by one release unprepared by the other with nothing left behind, caps unchanged, new claims prepared;
the compute shares of tenants launching under the old library held, and a claim the new agent prepared beside
them given its share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from upgrade_harness import COMPUTE, Figures, Unavailable, Upgrade, previous_release, this_release

pytestmark = [pytest.mark.limiter, pytest.mark.slow]

UNDER = 0.6
"""The part of its floor a launching tenant is sure to get over one window on a loaded 2-core machine (it launches
only when it gets a CPU)."""


def at_most(bound: float) -> float:
    """What a tenant held to `bound` percent of its GPU may show over one window: the fake driver's busy time runs
    about 5 % above the GPU time the library holds a claim to (bench/upgrade.py: 20.9 for 20, 41.7 for 40, 85 for
    80), and a burst admitted at the window's edge adds a little."""
    return bound * 1.1 + 2


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
    assert step.tenants_before == step.tenants_after == (3 if step.compute else 1), (
        "a tenant was restarted or died"
    )
    assert step.unanswered == [], "the kubelet's calls went unanswered while the agents changed"
    assert step.cap_after == step.cap_before > 0, "the claim's cap changed under its tenant"
    assert step.specs_unchanged, "the CDI specs of running claims changed"
    assert step.gpu_settings_unchanged, "the new agent remade or reset what the old one set up on the GPUs"
    assert step.claims_unprepared_after == step.claims_prepared_before == 4
    assert step.new_claims_prepared == 4
    assert step.left_behind == []


@pytest.mark.parametrize("direction", ["upgrade", "rollback"])
def test_compute_shares_of_tenants_launching_under_the_old_library_hold_and_a_new_claim_gets_its_share(
    figures: Figures, direction: str
) -> None:
    step = next(s for s in figures.steps if s.name == direction)
    if not step.compute:
        pytest.skip(figures.no_compute or "the compute shares were not measured")
    floor = {name: terms[0] for name, terms in COMPUTE.items()}
    ceiling = {name: terms[1] for name, terms in COMPUTE.items()}
    for moment, busy in step.compute.items():
        for name, share in busy.items():
            assert share >= UNDER * floor[name], f"{moment}: {name} got {share}% of its GPU, below its floor"
            assert share <= at_most(ceiling[name]), (
                f"{moment}: {name} got {share}% of its GPU, past its ceiling"
            )
        assert sum(busy.values()) <= at_most(100), (
            f"{moment}: the claims of one GPU took {busy}, more than all of it"
        )
    # Alone with the fixed claim, the elastic one may take all the fixed one leaves: it is seen borrowing when it
    # gets a third of that above its floor.
    borrowing = floor["elastic"] + (100 - floor["fixed"] - floor["elastic"]) / 3
    assert step.compute["before"]["elastic"] >= borrowing, f"the elastic claim did not borrow: {step.compute}"
    if direction == "upgrade":
        assert step.compute["after"]["elastic"] >= borrowing, (
            f"the upgrade stopped its borrowing: {step.compute}"
        )
    # The old library's claim borrows only what the other claims' floors leave, the new claim's included. Upgrade:
    # the 0.1.0 library cannot read an activity file of this release; the agent names an always-active stand-in
    # for the new claim on board.v1. Rollback: the old agent rewrites the board in its layout, and this release's
    # library runs its fixed floor.
    left = 100 - floor["fixed"] - floor["new"]
    assert step.compute["beside new"]["elastic"] <= at_most(left), (
        f"the old library's claim borrowed the new claim's floor: {step.compute['beside new']}"
    )
