"""Pydantic models of a CDI spec file, mirroring ``specs-go/config.go`` (spec 1.1.0).

Parsing is as strict as the runtimes' (``yaml.UnmarshalStrict``): unknown keys and wrong JSON
types fail. Python attributes are snake_case; JSON keys are exactly the spec's (``cdiVersion``,
``containerEdits``, ``deviceNodes``, ``additionalGids``, ...). Dumps use the JSON keys and drop
unset (``None``) fields, like the Go ``omitempty`` tags. Semantic rules (names, versions, env
syntax, hook names, ...) live in ``cdi.validation``, not here, so a loaded file can be reported
on rather than just refused.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from cdi.version import minimum_version

Uint32 = Annotated[int, Field(ge=0, le=0xFFFFFFFF)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: spec key names, unset fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class DeviceNode(_Model):
    """A device node to create in the container; the runtime stats ``host_path`` for what is unset."""

    path: str
    host_path: str | None = Field(default=None, alias="hostPath")
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: Uint32 | None = Field(default=None, alias="fileMode")
    permissions: str | None = None
    uid: Uint32 | None = None
    gid: Uint32 | None = None


class Mount(_Model):
    host_path: str = Field(alias="hostPath")
    container_path: str = Field(alias="containerPath")
    options: list[str] | None = None
    type: str | None = None


class Hook(_Model):
    hook_name: str = Field(alias="hookName")
    path: str
    args: list[str] | None = None
    env: list[str] | None = None
    timeout: int | None = None


class IntelRdt(_Model):
    clos_id: str | None = Field(default=None, alias="closID")
    l3_cache_schema: str | None = Field(default=None, alias="l3CacheSchema")
    mem_bw_schema: str | None = Field(default=None, alias="memBwSchema")
    schemata: list[str] | None = None
    enable_monitoring: bool | None = Field(default=None, alias="enableMonitoring")


class LinuxNetDevice(_Model):
    host_interface_name: str = Field(alias="hostInterfaceName")
    name: str


class ContainerEdits(_Model):
    env: list[str] | None = None
    device_nodes: list[DeviceNode] | None = Field(default=None, alias="deviceNodes")
    net_devices: list[LinuxNetDevice] | None = Field(default=None, alias="netDevices")
    hooks: list[Hook] | None = None
    mounts: list[Mount] | None = None
    intel_rdt: IntelRdt | None = Field(default=None, alias="intelRdt")
    additional_gids: list[Uint32] | None = Field(default=None, alias="additionalGids")

    def is_empty(self) -> bool:
        """True when applying these edits would change nothing (invalid for a device)."""
        return not (
            self.env
            or self.device_nodes
            or self.net_devices
            or self.hooks
            or self.mounts
            or self.additional_gids
            or self.intel_rdt is not None
        )


class Device(_Model):
    name: str
    annotations: dict[str, str] | None = None
    container_edits: ContainerEdits = Field(alias="containerEdits")


class Spec(_Model):
    """One CDI spec file. ``cdi_version`` may be left unset; writers fill in the minimum."""

    cdi_version: str | None = Field(default=None, alias="cdiVersion")
    kind: str
    annotations: dict[str, str] | None = None
    devices: list[Device]
    container_edits: ContainerEdits | None = Field(default=None, alias="containerEdits")

    def with_version(self) -> Spec:
        """This spec with ``cdi_version`` set: as given, or else the lowest that covers its features."""
        if self.cdi_version is not None:
            return self
        return self.model_copy(update={"cdi_version": minimum_version(self)})

    def to_json(self) -> str:
        """The spec file's JSON text; an unset ``cdi_version`` becomes the minimum required."""
        # Compact: the runtime reads it, and an indented dump takes the JSON module's slow pure-Python path.
        return json.dumps(self.with_version().to_dict()) + "\n"
