"""Leader election on a Lease, and the running controller (informers, worker, HTTP) on one FakeKube."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest
from test_controller_reconcile import BINPACK, Cluster
from waiting import wait_for

from dra_gpu.controller import Controller, Snapshot
from dra_gpu.controller.leader import LeaderElector
from dra_gpu.http_endpoint import HttpServer, bool_check, parse_address
from dra_gpu.kube.fake import FakeKube


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(api: FakeKube, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(
        api, identity, "kube-system", lease_duration_s=15, renew_deadline_s=10, monotonic=clock
    )


def test_only_one_replica_allocates_and_the_other_takes_over_after_the_lease_expires() -> None:
    c = Cluster()
    clock = Clock()
    replicas = {}
    for name in ("a", "b"):
        candidate = elector(c.api, name, clock)
        replicas[name] = (candidate, c.new_reconciler(is_leader=candidate.is_leader, monotonic=clock))

    def step(name: str) -> dict[str, Any]:
        candidate, reconciler = replicas[name]
        candidate.try_acquire_or_renew()
        return reconciler.reconcile(Snapshot.read(c.api)).allocated

    step("a")
    step("b")
    assert replicas["a"][0].is_leader() and not replicas["b"][0].is_leader()
    c.claim("first", BINPACK, 10)
    c.pod("p1", "first")
    assert step("b") == {}  # standby: no writes
    assert list(step("a")) == ["default/first"]
    assert step("b") == {}  # sees the renewed record
    lease = c.api.get("Lease", "dra-gpu-controller", "kube-system")
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 15

    # "a" stops renewing (crashed). Until "b" has seen the same record for a full lease duration
    # (its own clock, not the holder's renewTime, so skew between nodes does not matter) it waits ...
    c.claim("second", BINPACK, 10)
    c.pod("p2", "second")
    clock.now += 14
    assert step("b") == {}
    # ... and then it takes over.
    clock.now += 2
    assert list(step("b")) == ["default/second"]
    lease = c.api.get("Lease", "dra-gpu-controller", "kube-system")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    # "a" comes back: it sees a fresh record held by "b" and stands by.
    assert not replicas["a"][0].try_acquire_or_renew()
    assert not replicas["a"][0].is_leader()


def test_a_renewing_leader_keeps_the_lease_and_a_released_lease_is_taken_at_once() -> None:
    api = FakeKube()
    clock = Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    for _ in range(5):
        clock.now += 5
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader()
    assert b.try_acquire_or_renew()


def test_two_candidates_racing_for_a_free_lease_get_one_winner() -> None:
    api = FakeKube()
    clock = Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    a.release()
    # Both read the released lease; the second write carries a stale resourceVersion.
    stale = api.get("Lease", "dra-gpu-controller", "kube-system")
    assert b.try_acquire_or_renew()
    original_get = api.get
    api.get = lambda *args, **kwargs: stale  # type: ignore[method-assign]
    try:
        assert not a.try_acquire_or_renew()
    finally:
        api.get = original_get  # type: ignore[method-assign]
    assert api.get("Lease", "dra-gpu-controller", "kube-system")["spec"]["holderIdentity"] == "b"


def test_a_leader_that_cannot_renew_steps_down_after_the_renew_deadline() -> None:
    api = FakeKube()
    clock = Clock()
    a = elector(api, "a", clock)
    assert a.try_acquire_or_renew()
    lease = api.get("Lease", "dra-gpu-controller", "kube-system")
    lease["spec"]["holderIdentity"] = "intruder"
    api.update("Lease", lease)
    clock.now += 1
    assert not a.try_acquire_or_renew()
    assert not a.is_leader()


def test_renew_deadline_must_be_shorter_than_the_lease() -> None:
    with pytest.raises(ValueError, match="renew deadline must be shorter than the lease duration"):
        LeaderElector(FakeKube(), "a", "ns", lease_duration_s=5, renew_deadline_s=5)


def test_running_controllers_allocate_once_and_serve_metrics() -> None:
    c = Cluster()
    a = Controller(c.api, identity="a", namespace="kube-system", retry_period_s=0.1, resync_s=1)
    b = Controller(c.api, identity="b", namespace="kube-system", retry_period_s=0.1, resync_s=1)
    server = HttpServer(
        "127.0.0.1:0", a.metrics.registry, {"/healthz": bool_check(a.healthy), "/readyz": bool_check(a.ready)}
    )
    a.start()
    server.start()
    try:
        wait_for(a.is_leader)
        b.start()
        for i in range(3):
            c.claim(f"c{i}", BINPACK, 10)
            c.pod(f"p{i}", f"c{i}")
        wait_for(lambda: all("allocation" in c.get(f"c{i}").get("status", {}) for i in range(3)))
        assert not b.is_leader()
        devices = {c.device_of(f"c{i}") for i in range(3)}
        assert devices == {("node-0", "gpu-0")}  # bin-packed, each share counted once
        base = f"http://127.0.0.1:{server.port}"
        metrics = urllib.request.urlopen(f"{base}/metrics").read().decode()
        assert "dra_gpu_controller_allocations_total 3.0" in metrics
        assert "dra_gpu_controller_is_leader 1.0" in metrics
        assert urllib.request.urlopen(f"{base}/healthz").read() == b"ok\n"
        assert urllib.request.urlopen(f"{base}/readyz").read() == b"ok\n"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{base}/nope")
        # The leader shuts down cleanly and hands the lease over; the other replica carries on.
        server.stop()
        a.stop()
        wait_for(b.is_leader)
        c.claim("late", BINPACK, 10)
        c.pod("p-late", "late")
        wait_for(lambda: "allocation" in c.get("late").get("status", {}))
    finally:
        a.stop()
        b.stop()


def test_http_address_errors_are_clear() -> None:
    assert parse_address(":8080") == ("0.0.0.0", 8080)
    assert parse_address("[::]:9090") == ("::", 9090)
    with pytest.raises(ValueError, match="expected HOST:PORT such as :8080"):
        parse_address("8080")


def test_event_timestamps_are_utc() -> None:
    c = Cluster()
    c.claim("share", BINPACK, 10)
    c.pod("p", "share")
    c.run()
    (event,) = c.events("share", "Allocated")
    stamp = datetime.strptime(event["lastTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 3600
