"""The controller's informer cache and its threads survive what a real API connection does to them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from waiting import wait_for

from dra_gpu.controller import Controller
from dra_gpu.controller.cache import Informer
from dra_gpu.kube.api import WatchEvent
from dra_gpu.kube.fake import FakeKube


class Flaky(FakeKube):
    """A FakeKube whose first watches and lease reads fail the way a dropped connection does: with the
    HTTP library's own exception, not an ApiError."""

    def __init__(self, watch_failures: int = 0, lease_failures: int = 0) -> None:
        super().__init__()
        self.watch_failures = watch_failures
        self.lease_failures = lease_failures

    def watch(self, kind: str, *args: Any, **kwargs: Any) -> Iterator[WatchEvent]:
        if self.watch_failures > 0:
            self.watch_failures -= 1
            raise ConnectionResetError("Connection broken: IncompleteRead(0 bytes read)")
        return super().watch(kind, *args, **kwargs)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        if kind == "Lease" and self.lease_failures > 0:
            self.lease_failures -= 1
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return super().get(kind, name, namespace)


def test_an_informer_survives_a_broken_watch_connection_and_lists_again() -> None:
    api = Flaky(watch_failures=2)
    informer = Informer(api, "Node", watch_timeout_s=0.5, retry_s=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: api.watch_failures == 0)
        api.create("Node", {"metadata": {"name": "node-1"}})
        wait_for(lambda: informer.get("", "node-1") is not None)
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(5)


def test_the_controller_stays_healthy_when_a_lease_round_cannot_reach_the_api_server() -> None:
    api = Flaky(lease_failures=2)
    controller = Controller(api, identity="a", namespace="kube-system", retry_period_s=0.05, resync_s=1)
    controller.start()
    try:
        wait_for(controller.is_leader)
        assert api.lease_failures == 0
        assert controller.healthy()  # the leader thread is still running after the failed rounds
    finally:
        controller.stop()


def test_an_object_deleted_by_our_own_write_is_not_put_back_into_the_cache() -> None:
    api = FakeKube()
    informer = Informer(api, "ResourceClaim")
    claim = api.create(
        "ResourceClaim",
        {
            "metadata": {"name": "c", "namespace": "ns", "finalizers": ["gpu.dra-gpu.io/allocation"]},
            "spec": {},
        },
    )
    informer.relist()
    api.delete("ResourceClaim", "c", "ns")  # held by the finalizer: only marked for deletion
    marked = api.get("ResourceClaim", "c", "ns")
    marked["metadata"]["finalizers"] = []
    gone = api.update("ResourceClaim", marked)  # removing the last finalizer deletes it
    informer._apply("DELETED", gone)  # the watch happened to deliver the deletion first
    informer.assume(gone)  # then the writer hands the cache the object its PUT returned
    assert informer.get("ns", "c") is None
    assert claim["metadata"]["uid"] == gone["metadata"]["uid"]


class DeafWatches(FakeKube):
    """Watches that, like a real API server's, notice `stop` only when their next event arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.release_watches = threading.Event()

    def watch(self, kind: str, *args: Any, **kwargs: Any) -> Iterator[WatchEvent]:
        kwargs.pop("stop", None)
        kwargs["timeout_s"] = 0.1
        self.release_watches.wait(30)
        return super().watch(kind, *args, **kwargs)


def test_stopping_hands_the_lease_over_before_waiting_for_the_watches() -> None:
    api = DeafWatches()
    controller = Controller(api, identity="a", namespace="kube-system", retry_period_s=0.05, resync_s=1)
    controller.start()
    stopper = threading.Thread(target=controller.stop, kwargs={"timeout_s": 10})
    try:
        wait_for(controller.is_leader)
        stopper.start()
        wait_for(
            lambda: api.get("Lease", "dra-gpu-controller", "kube-system")["spec"]["holderIdentity"] == ""
        )
        assert stopper.is_alive()  # still waiting for the watches, yet the standby can take over now
    finally:
        api.release_watches.set()
        stopper.join(15)
    assert not stopper.is_alive()
