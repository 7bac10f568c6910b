"""The controller's allocator reads capacity names as the server's scheduler does: verbatim before
Kubernetes 1.38, `gpu.dra-gpu.io/memory` as `memory` from 1.38 (kubernetes/kubernetes PR #142202)."""

from __future__ import annotations

import pytest
from test_controller_reconcile import BINPACK, Cluster

from dra_gpu import DRIVER_NAME
from dra_gpu.kube import builders
from dra_gpu.kube.fake import FakeKube


@pytest.mark.parametrize(("version", "allocates"), [((1, 37), False), ((1, 38), True)])
def test_a_claim_naming_capacities_with_the_drivers_domain(version: tuple[int, int], allocates: bool) -> None:
    c = Cluster(api=FakeKube(version=version))
    capacity = {f"{DRIVER_NAME}/cores": "30", f"{DRIVER_NAME}/memory": "10Gi"}
    c.api.create("ResourceClaim", builders.claim("share", BINPACK, capacity=capacity))
    c.pod("p", "share")
    result = c.run()
    assert ("default/share" in result.allocated) == allocates
    if allocates:
        (res,) = c.get("share")["status"]["allocation"]["devices"]["results"]
        assert res["consumedCapacity"] == {"cores": "30", "memory": "10Gi"}, (
            "charged as the device names them"
        )
    else:
        assert "status" not in c.get("share") or not c.get("share")["status"].get("allocation")
