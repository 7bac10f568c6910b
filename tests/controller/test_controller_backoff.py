"""The controller against an API server that does not answer: backoff, one warning, readiness.

The controller runs with the real client against a port where nothing listens (the API server down),
then an API server comes up on that port and the controller must notice it, all without a traceback
and with one warning for the outage and one line for the recovery.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Iterator

import kubernetes
import pytest
from http_api_server import ApiServer
from ports import unused_port
from waiting import wait_for

from dra_gpu.controller import Controller
from dra_gpu.controller.backoff import Backoff
from dra_gpu.http_endpoint import HttpServer, bool_check


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_backoff_doubles_up_to_the_cap_with_jitter_and_resets() -> None:
    top = Backoff(1.0, 8.0, rng=lambda: 1.0)
    assert [top.next_delay() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    top.reset()
    assert top.next_delay() == 1.0
    bottom = Backoff(1.0, 8.0, rng=lambda: 0.0)  # jitter draws from the upper half of each step
    assert [bottom.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    with pytest.raises(ValueError):
        Backoff(0, 1)


@pytest.fixture
def dra_gpu_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="dra_gpu")
    yield caplog


def test_the_controller_is_quiet_and_not_ready_while_the_api_server_is_down(
    dra_gpu_logs: pytest.LogCaptureFixture,
) -> None:
    port = unused_port()  # nothing listens here yet: connections are refused
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = 0
    from dra_gpu.kube.client import KubeClient

    api = KubeClient(kubernetes.client.ApiClient(configuration))
    controller = Controller(
        api, identity="a", namespace="kube-system", retry_period_s=0.05, backoff_s=0.02, max_backoff_s=0.2
    )
    http = HttpServer(
        "127.0.0.1:0",
        controller.metrics.registry,
        {"/healthz": bool_check(controller.healthy), "/readyz": controller.readiness},
        name="controller-http",
    )
    http.start()
    controller.start()
    server: ApiServer | None = None
    try:
        # Every informer and the leader election retry several times, each further apart.
        wait_for(lambda: all(i._backoff.failures >= 4 for i in controller.informers.values()))
        records = [r for r in dra_gpu_logs.records if r.name.startswith("dra_gpu")]
        warnings = [r for r in records if r.levelno >= logging.WARNING]
        assert [r.getMessage() for r in warnings] == [
            "calls to the API server fail; retrying with backoff, logging again when they succeed"
        ]
        assert not [r for r in records if r.exc_info]  # no traceback per round
        assert controller.healthy()  # alive: restarting the pod would not bring the API server back
        assert not controller.ready()
        code, body = probe(http.port, "/readyz")
        assert code == 503 and "calls to the API server fail" in body and "Connection refused" in body
        assert probe(http.port, "/healthz")[0] == 200
        assert not controller.is_leader()

        server = ApiServer(port)  # the API server is back
        wait_for(controller.ready)
        wait_for(controller.is_leader)
        assert probe(http.port, "/readyz")[0] == 200
        records = [r for r in dra_gpu_logs.records if r.name.startswith("dra_gpu")]
        assert [r.getMessage() for r in records if r.getMessage().startswith("calls to the API server")] == [
            "calls to the API server fail; retrying with backoff, logging again when they succeed",
            "calls to the API server succeed again",
        ]
        assert len([r for r in records if r.levelno >= logging.WARNING]) == 1
    finally:
        # Real watches notice the stop only with their next event: do not wait for them here.
        controller.stop(timeout_s=0.5)
        http.stop()
        if server is not None:
            server.close()
