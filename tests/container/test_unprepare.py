"""After NodeUnprepareResources the claim is gone for the runtime too, not only in our bookkeeping."""

from __future__ import annotations

import re

import pytest
from container_node import Node
from container_support import UNRESOLVABLE, Podman, SpecRefused, Volume, specs_providing
from plugin_harness import Alloc, gpu_config

pytestmark = pytest.mark.container


def test_an_unprepared_claims_device_is_unresolvable_and_its_state_is_gone(
    node: Node, podman: Podman, driver_stand_in: list[Volume]
) -> None:
    allocs = [
        Alloc(
            device="gpu-1",
            share_id="1d2e3f40-0000-4000-8000-000000000001",
            consumed={"memory": "2Gi", "cores": "20"},
        )
    ]
    claim, ids = node.prepare("short-lived", allocs, gpu_config("Limiter"))
    state = node.claim_dir(claim)
    before = podman.run("limiter-probe info", devices=ids, volumes=driver_stand_in).check()
    assert before.stdout.startswith("total=")
    assert (state / "limiter").is_dir()

    node.unprepare(claim)

    assert not state.exists()
    with pytest.raises(SpecRefused, match="defines " + re.escape(ids[0])):
        specs_providing(podman.cdi_dir, ids)
    # The runtime's own verdict: the container does not start at all.
    after = podman.run("echo started", devices=ids, volumes=driver_stand_in, check_specs=False)
    assert after.returncode != 0
    assert "started" not in after.stdout
    assert f"{UNRESOLVABLE} {ids[0]}" in after.stderr
