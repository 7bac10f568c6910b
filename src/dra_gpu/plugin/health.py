"""Health: device health streamed to the kubelet (KEP-4680) and a liveness probe over the real sockets.

The stream is served as health API v1 (kubelet 1.37+ prefers it) and v1alpha1 (older kubelets).

The probe behind `/healthz` dials both sockets as the kubelet does (registration `GetInfo`, then the
standard gRPC health check on the DRA socket), so a wedged server or a deleted socket fails it. It runs
in a thread of its own (`HealthProbe`); `/healthz` answers from its last result at once, so a probe
never waits behind a slow socket, and a probe that stopped finishing is itself a failure.

The DRA socket's health check runs in the same handler pool as the kubelet's calls: while calls are
in flight (a burst after a reboot, a slow `nvidia-smi`) it would wait behind them, and liveness would
restart the agent in the middle of its work. So while the agent is busy the probe asks only that the
socket's gRPC transport answer (a connection made ready, which needs no handler thread), and the
agent's own record of its calls says whether they make progress (`Preparer.stalled`). The same round
writes a small file in the state directory and looks at its free space: an agent whose state cannot
be written cannot prepare anything (`StateDirCheck`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dra_gpu.inventory import GpuInfo, Inventory
from dra_gpu.proto import (
    health_v1,
    health_v1_grpc,
    health_v1alpha1,
    health_v1alpha1_grpc,
    registration,
    registration_grpc,
)

MAX_MESSAGE = 1024
MIN_FREE_BYTES = 1024 * 1024
"""Below this much free space in the state directory, a prepare's records and files may not fit."""
HEALTH_FILE = ".healthz"

Problem = Callable[[], str | None]
"""Why the agent cannot do its job now, or None; answered from memory or with a quick local look."""


class DeviceHealthStream:
    """The complete list of the node's GPUs, on change and as heartbeat.

    Health v1 and v1alpha1 have the same messages under different packages, so one stream serves
    both; `watch` gets the generated module of the version the kubelet called.
    """

    def __init__(
        self,
        inventory: Inventory,
        pool: str,
        device_name: Callable[[GpuInfo], str],
        stop: threading.Event,
        poll_s: float = 1.0,
        heartbeat_s: float = 10.0,
    ) -> None:
        self.inventory = inventory
        self.pool = pool
        self.device_name = device_name
        self.stop = stop
        self.poll_s = poll_s
        self.heartbeat_s = heartbeat_s

    def _snapshot(self) -> tuple[tuple[str, bool, str], ...]:
        return tuple((self.device_name(g), g.healthy, g.health_reason) for g in self.inventory.gpus())

    def _message(self, pb: ModuleType, snapshot: tuple[tuple[str, bool, str], ...]) -> Any:
        now = int(time.time())
        return pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=self.pool, device_name=name),
                    health=pb.HEALTHY if healthy else pb.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=int(self.heartbeat_s * 3),
                    message=reason[:MAX_MESSAGE],
                )
                for name, healthy, reason in snapshot
            ]
        )

    def watch(self, pb: ModuleType, context: Any) -> Iterator[Any]:
        last: tuple[tuple[str, bool, str], ...] | None = None
        sent_at = 0.0
        while not self.stop.is_set() and context.is_active():
            snapshot = self._snapshot()
            if snapshot != last or time.monotonic() - sent_at >= self.heartbeat_s:
                yield self._message(pb, snapshot)
                last, sent_at = snapshot, time.monotonic()
            self.stop.wait(self.poll_s)


class DeviceHealthServicer(health_v1_grpc.DRAResourceHealthServicer):
    """`v1.DRAResourceHealth` (kubelet 1.37+ prefers it)."""

    def __init__(self, stream: DeviceHealthStream) -> None:
        self.stream = stream

    def NodeWatchResources(
        self, request: health_v1.NodeWatchResourcesRequest, context: Any
    ) -> Iterator[health_v1.NodeWatchResourcesResponse]:
        return self.stream.watch(health_v1, context)


class DeviceHealthV1alpha1Servicer(health_v1alpha1_grpc.DRAResourceHealthServicer):
    """`v1alpha1.DRAResourceHealth`, the same stream for kubelets before 1.37."""

    def __init__(self, stream: DeviceHealthStream) -> None:
        self.stream = stream

    def NodeWatchResources(
        self, request: health_v1alpha1.NodeWatchResourcesRequest, context: Any
    ) -> Iterator[health_v1alpha1.NodeWatchResourcesResponse]:
        return self.stream.watch(health_v1alpha1, context)


class StateDirCheck:
    """Whether the state directory takes a write and has room: `check()` writes a small file there."""

    def __init__(self, state_dir: Path, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        self.state_dir = state_dir
        self.min_free_bytes = min_free_bytes

    def check(self) -> str | None:
        path = self.state_dir / HEALTH_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"%.3f\n" % time.time())
            finally:
                os.close(fd)
            st = os.statvfs(self.state_dir)
        except OSError as exc:
            return f"the state directory {self.state_dir} cannot be written: {os.strerror(exc.errno or 0)}"
        free = st.f_bavail * st.f_frsize
        if free < self.min_free_bytes:
            with contextlib.suppress(OSError):
                path.unlink()
            return (
                f"the state directory {self.state_dir} is full ({free} bytes free, at least "
                f"{self.min_free_bytes} needed): prepares cannot record their claims"
            )
        return None


class HealthProbe:
    """`probe()` every `interval_s` in a thread; `check()` answers from the last result, at once.

    The sockets' existence is looked at on every `check()` (a stat, which does not wait on anyone),
    so a deleted socket fails the next check. A result older than `stale_s` fails too: the probe
    itself hangs. `busy` says whether the kubelet's calls hold the DRA socket's handlers (then only
    its transport is probed); each of `problems` is asked in the same round.
    """

    def __init__(
        self,
        registration_socket: Path,
        service_socket: Path,
        interval_s: float = 2.0,
        timeout_s: float = 2.0,
        *,
        busy: Callable[[], bool] = lambda: False,
        problems: Sequence[Problem] = (),
    ) -> None:
        self.sockets = (registration_socket, service_socket)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.stale_s = 3 * (interval_s + timeout_s)
        self.busy = busy
        self.problems = tuple(problems)
        self._result: tuple[bool, str, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="health-probe", daemon=True)

    def start(self) -> None:
        self.run_once()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout_s * 2 + 1)

    def run_once(self) -> None:
        for problem in self.problems:
            why = problem()
            if why is not None:
                self._result = (False, why, time.monotonic())
                return
        ok, why = probe(*self.sockets, timeout_s=self.timeout_s, busy=self.busy)
        self._result = (ok, why, time.monotonic())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception as exc:  # the next round tries again; meanwhile the result goes stale
                self._result = (False, f"the health probe failed: {exc}", time.monotonic())

    def check(self) -> tuple[bool, str]:
        for path in self.sockets:
            if not path.exists():
                return False, f"socket {path} does not exist"
        result = self._result
        if result is None:
            return False, "not probed yet"
        ok, why, at = result
        age = time.monotonic() - at
        if age > self.stale_s:
            return False, f"the gRPC health probe has not finished for {age:.0f}s"
        return ok, why


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text.replace("\x00", ""))[:MAX_MESSAGE]


def probe(
    registration_socket: Path,
    service_socket: Path,
    timeout_s: float = 2.0,
    busy: Callable[[], bool] = lambda: False,
) -> tuple[bool, str]:
    """(healthy, why): both sockets answer like a kubelet expects.

    While `busy()` (the kubelet's calls hold the DRA socket's handlers), the DRA socket's health
    check would queue behind them: its transport answering is enough then."""
    for path in (registration_socket, service_socket):
        if not path.exists():
            return False, f"socket {path} does not exist"
    try:
        with grpc.insecure_channel(f"unix://{registration_socket}") as channel:
            info = registration_grpc.RegistrationStub(channel).GetInfo(
                registration.InfoRequest(), timeout=timeout_s
            )
        with grpc.insecure_channel(f"unix://{service_socket}") as channel:
            if busy():
                try:
                    grpc.channel_ready_future(channel).result(timeout=timeout_s)
                except grpc.FutureTimeoutError:
                    return (
                        False,
                        f"the DRA socket {service_socket} did not accept a connection in {timeout_s}s",
                    )
                return True, f"ok: {info.name} serving, busy with the kubelet's calls"
            try:
                status = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=timeout_s
                )
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and busy():  # a burst began meanwhile
                    return True, f"ok: {info.name} serving, busy with the kubelet's calls"
                raise
    except grpc.RpcError as exc:
        return False, _printable(f"gRPC probe failed: {exc.code().name}: {exc.details()}")
    if status.status != health_pb2.HealthCheckResponse.SERVING:
        return False, f"DRA service is {health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)}"
    return True, f"ok: {info.name} serving {', '.join(info.supported_versions)}"
