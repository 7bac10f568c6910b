"""The kubelet's side of the plugin protocol, as far as the demo needs it: register, prepare, unprepare.

This is a stand-in for the kubelet, speaking the real gRPC protocol over the plugin's real unix
sockets: `GetInfo` and `NotifyRegistrationStatus` on the registration socket, then
`NodePrepareResources` / `NodeUnprepareResources` (DRA v1) on the service socket the plugin names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_gpu.kube import objects
from dra_gpu.proto import DRA_V1_SERVICE, PLUGIN_TYPE, dra_v1, dra_v1_grpc, registration, registration_grpc

Obj = dict[str, Any]


class KubeletError(RuntimeError):
    """The plugin refused registration or a call failed as a whole."""


@dataclass
class PreparedDevice:
    requests: list[str]
    pool: str
    device: str
    cdi_ids: list[str]
    share_id: str | None


@dataclass
class Prepared:
    claim: str  # namespace/name
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class KubeletStandIn:
    def __init__(self, registration_socket: Path, timeout_s: float = 10.0) -> None:
        self.registration_socket = registration_socket
        self.timeout_s = timeout_s
        self.driver = ""
        self._channel: grpc.Channel | None = None
        self._stub: Any = None

    def register(self) -> Obj:
        """What the kubelet's plugin watcher does with a new registration socket."""
        with grpc.insecure_channel(f"unix://{self.registration_socket}") as channel:
            stub = registration_grpc.RegistrationStub(channel)
            info = stub.GetInfo(registration.InfoRequest(), timeout=self.timeout_s)
            problem = None
            if info.type != PLUGIN_TYPE:
                problem = f"plugin type {info.type!r}, expected {PLUGIN_TYPE!r}"
            elif DRA_V1_SERVICE not in info.supported_versions:
                problem = f"no {DRA_V1_SERVICE} among {list(info.supported_versions)}"
            stub.NotifyRegistrationStatus(
                registration.RegistrationStatus(plugin_registered=problem is None, error=problem or ""),
                timeout=self.timeout_s,
            )
        if problem:
            raise KubeletError(f"registration refused: {problem}")
        self.driver = info.name
        self._channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        self._stub = dra_v1_grpc.DRAPluginStub(self._channel)
        return {"name": info.name, "endpoint": info.endpoint, "versions": list(info.supported_versions)}

    def prepare(self, claims: Iterable[Mapping[str, Any]]) -> dict[str, Prepared]:
        """NodePrepareResources for the claims of one pod, by claim UID."""
        wanted = [self._claim(c) for c in claims]
        response = self._call("NodePrepareResources", dra_v1.NodePrepareResourcesRequest(claims=wanted))
        out: dict[str, Prepared] = {}
        for claim in wanted:
            answer = response.claims.get(claim.uid)
            name = f"{claim.namespace}/{claim.name}"
            if answer is None:
                out[claim.uid] = Prepared(name, error="the plugin did not answer for this claim")
                continue
            devices = [
                PreparedDevice(
                    list(d.request_names),
                    d.pool_name,
                    d.device_name,
                    list(d.cdi_device_ids),
                    d.share_id if d.HasField("share_id") else None,
                )
                for d in answer.devices
            ]
            out[claim.uid] = Prepared(name, devices, answer.error)
        return out

    def unprepare(self, claims: Iterable[Mapping[str, Any]]) -> dict[str, str]:
        """NodeUnprepareResources; the per-claim error strings (empty when done)."""
        wanted = [self._claim(c) for c in claims]
        response = self._call("NodeUnprepareResources", dra_v1.NodeUnprepareResourcesRequest(claims=wanted))
        return {
            c.uid: response.claims[c.uid].error if c.uid in response.claims else "no answer" for c in wanted
        }

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _call(self, method: str, request: Any) -> Any:
        if self._stub is None:
            raise KubeletError("not registered")
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise KubeletError(f"{method} failed: {exc.code().name}: {exc.details()}") from None

    @staticmethod
    def _claim(claim: Mapping[str, Any]) -> Any:
        return dra_v1.Claim(
            namespace=objects.namespace(claim), uid=objects.uid(claim), name=objects.name(claim)
        )
