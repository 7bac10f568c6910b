"""The plugin-registration service the kubelet's plugin watcher calls on our registration socket."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from dra_gpu.proto import PLUGIN_TYPE, registration, registration_grpc

log = logging.getLogger(__name__)


class RegistrationServicer(registration_grpc.RegistrationServicer):
    def __init__(
        self,
        driver: str,
        endpoint: str,
        versions: Sequence[str],
        on_status: Callable[[bool, str], None] | None = None,
    ) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.versions = list(versions)
        self.on_status = on_status

    def GetInfo(self, request: registration.InfoRequest, context: Any) -> registration.PluginInfo:
        return registration.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint, supported_versions=self.versions
        )

    def NotifyRegistrationStatus(
        self, request: registration.RegistrationStatus, context: Any
    ) -> registration.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info(
                "the kubelet registered the plugin", extra={"driver": self.driver, "endpoint": self.endpoint}
            )
        else:
            log.error(
                "THE KUBELET REFUSED TO REGISTER THE PLUGIN: pods using this driver's claims cannot start "
                "on this node",
                extra={"driver": self.driver, "error": request.error, "versions": self.versions},
            )
        if self.on_status is not None:
            self.on_status(bool(request.plugin_registered), str(request.error))
        return registration.RegistrationStatusResponse()
