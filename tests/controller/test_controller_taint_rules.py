"""The controller places claims of its classes as the scheduler would around an admin's DeviceTaintRules: a
device a rule taints (NoSchedule or NoExecute) is not allocated to a claim that does not tolerate it; a server
that does not serve DeviceTaintRules (before 1.37 without the gate: 404) has none. The matching rules are
restated, with their upstream source, in tests/allocator/test_allocator_taint_rules.py."""

from __future__ import annotations

from typing import Any

from test_controller_reconcile import BINPACK, Cluster

from dra_gpu.controller.reconciler import read_taint_rules
from dra_gpu.kube import NotFound, builders
from dra_gpu.kube.fake import FakeKube

BROKEN = {"key": "example.com/broken", "effect": "NoExecute"}


def test_a_device_an_admin_tainted_is_not_allocated() -> None:
    c = Cluster()
    c.api.create("DeviceTaintRule", builders.device_taint_rule("gpu-0-broken", BROKEN, {"device": "gpu-0"}))
    for n in range(3):
        c.claim(f"share-{n}", BINPACK, 30, "10Gi")
        c.pod(f"p-{n}", f"share-{n}")
    result = c.run()
    assert len(result.allocated) == 3
    assert {c.device_of(f"share-{n}")[1] for n in range(3)} == {"gpu-1"}, "bin-packed, never on gpu-0"


def test_with_every_device_tainted_the_claim_waits_saying_why() -> None:
    c = Cluster()
    c.api.create("DeviceTaintRule", builders.device_taint_rule("all", BROKEN, {}))
    c.claim("share", BINPACK, 30, "10Gi")
    c.pod("p", "share")
    result = c.run()
    assert "default/share" in result.failed and "tainted, not tolerated" in result.failed["default/share"]


class WithoutTaintRules(FakeKube):
    """An API server of a version that does not serve DeviceTaintRules."""

    def list(self, kind: str, *args: Any, **kwargs: Any) -> Any:
        if kind == "DeviceTaintRule":
            raise NotFound("the server could not find the requested resource")
        return super().list(kind, *args, **kwargs)


def test_a_server_without_taint_rules_has_none_and_claims_are_placed() -> None:
    c = Cluster(api=WithoutTaintRules())
    assert read_taint_rules(c.api) == []
    c.claim("share", BINPACK, 30, "10Gi")
    c.pod("p", "share")
    assert "default/share" in c.run().allocated
