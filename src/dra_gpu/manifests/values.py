"""The values the manifests are rendered from: defaults in one file, an admin's overrides merged on top.

The defaults live only in `templates/manifests/values.yaml`; the models below give every key a type
and refuse unknown keys, so a typo in an admin's values file is an error that names the key instead of
a silently ignored setting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dra_gpu import __version__
from dra_gpu.config import ConfigError, NodeSharing, Placement, Strategy
from dra_gpu.inventory.simulated import parse_profile, split_options
from dra_gpu.inventory.types import InventoryError
from dra_gpu.kube import names, versions
from dra_gpu.quantity import QuantityError, parse_quantity

TEMPLATES = "templates/manifests"
DEFAULT_VALUES = "values.yaml"


class ValuesError(ValueError):
    """A values file that cannot be used; the message names the file and the key."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _api(value: str, check: Callable[[str], list[str]], field: str) -> str:
    """`value` as the API server checks the field it becomes; the error names the value and the rule."""
    problems = check(value)
    if problems:
        raise ValueError(f"{value!r} is not a valid {field}: {problems[0]}")
    return value


def _no_whitespace(value: str) -> list[str]:
    return ["must not have leading or trailing whitespace"] if value != value.strip() else []


_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_TAINT_EFFECTS = {"", "NoSchedule", "PreferNoSchedule", "NoExecute"}


def _toleration_problem(toleration: dict[str, Any]) -> str:
    """The first rule of Kubernetes' toleration validation that `toleration` breaks ("" if none)."""
    unknown = set(toleration) - _TOLERATION_KEYS
    if unknown:
        return f"unknown field {sorted(unknown)[0]!r} (fields: {', '.join(sorted(_TOLERATION_KEYS))})"
    key = str(toleration.get("key") or "")
    operator = toleration.get("operator") or "Equal"
    value = str(toleration.get("value") or "")
    effect = toleration.get("effect") or ""
    if key and names.qualified_name(key):
        return f"key {key!r}: {names.qualified_name(key)[0]}"
    if operator not in ("Equal", "Exists"):
        return f"operator {operator!r}: must be Equal or Exists"
    if not key and operator != "Exists":
        return "operator must be Exists when key is empty (which matches every taint)"
    if operator == "Exists" and value:
        return "value must be empty when operator is Exists"
    if operator == "Equal" and names.label_value(value):
        return f"value {value!r}: {names.label_value(value)[0]}"
    if effect not in _TAINT_EFFECTS:
        return f"effect {effect!r}: must be NoSchedule, PreferNoSchedule or NoExecute (or empty for all)"
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        return "effect must be NoExecute when tolerationSeconds is set"
    return ""


def _resources(value: dict[str, Any]) -> dict[str, Any]:
    """A container's resources: requests and limits of quantities, no request above its limit."""
    unknown = set(value) - {"requests", "limits"}
    if unknown:
        raise ValueError(f"unknown field {sorted(unknown)[0]!r}: resources take requests and limits")
    parsed: dict[str, dict[str, Any]] = {}
    for kind in ("requests", "limits"):
        parsed[kind] = {}
        for name, quantity in (value.get(kind) or {}).items():
            try:
                parsed[kind][name] = parse_quantity(str(quantity))
            except QuantityError:
                raise ValueError(
                    f"{kind}.{name}: {quantity!r} is not a Kubernetes quantity (e.g. 128Mi, 50m)"
                ) from None
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is not None and request > limit:
            raise ValueError(
                f"requests.{name} {value['requests'][name]!r} must be less than or equal to its limit"
            )
    return value


class Image(_Model):
    repository: str = Field(min_length=1)
    tag: str | None
    pullPolicy: Literal["Always", "IfNotPresent", "Never"]

    @field_validator("repository", "tag")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return value if value is None else _api(value, _no_whitespace, "image reference part")


class KubeletPlugin(_Model):
    namespace: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    kubeletDir: str = Field(pattern=r"^/")
    cdiDir: str = Field(pattern=r"^/")
    stateDir: str = Field(pattern=r"^/")
    driverRoot: str = Field(pattern=r"^/")
    mpsShmSize: str = Field(pattern=r"^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$")
    mpsCgroup: str | None = Field(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
    gpuBackend: str = Field(pattern=r"^(nvml|simulated:.+)$")
    sharing: str
    migDynamic: bool
    httpPort: int = Field(ge=1, le=65535)
    monitorInterval: float = Field(ge=0)
    privileged: bool | None
    runtimeClassName: str | None
    priorityClassName: str | None
    nodeSelector: dict[str, str]
    gpuNodeLabels: list[str]
    tolerations: list[dict[str, Any]]
    resources: dict[str, Any]
    seamlessUpgrade: bool

    @field_validator("gpuNodeLabels")
    @classmethod
    def _gpu_node_labels(cls, value: list[str]) -> list[str]:
        for entry in value:
            key, _, label = entry.partition("=")
            problems = names.qualified_name(key) + names.label_value(label)
            if problems:
                raise ValueError(f"{entry!r} is not a node label (write KEY=VALUE or KEY): {problems[0]}")
        return value

    @field_validator("runtimeClassName", "priorityClassName")
    @classmethod
    def _class_name(cls, value: str | None) -> str | None:
        return value if value is None else _api(value, names.dns1123_subdomain, "object name")

    @field_validator("nodeSelector")
    @classmethod
    def _node_selector(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            _api(key, names.qualified_name, "label key")
            _api(label, names.label_value, "label value")
        return value

    @field_validator("tolerations")
    @classmethod
    def _tolerations(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, toleration in enumerate(value):
            problem = _toleration_problem(toleration)
            if problem:
                raise ValueError(f"toleration {i}: {problem}")
        return value

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _resources(value)

    @field_validator("gpuBackend")
    @classmethod
    def _backend(cls, value: str) -> str:
        # The agent's own parser: a profile the agent would refuse at start is refused here.
        if value.startswith("simulated:"):
            profile = value.removeprefix("simulated:")
            try:
                parse_profile(split_options(profile)[0])
            except InventoryError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("sharing")
    @classmethod
    def _sharing(cls, value: str) -> str:
        try:
            NodeSharing.parse(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value


class ControllerClass(_Model):
    name: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", max_length=253
    )
    strategy: Strategy
    placement: Placement


class Controller(_Model):
    enabled: bool
    replicas: int = Field(ge=0)
    leaderElect: bool
    httpPort: int = Field(ge=1, le=65535)
    resources: dict[str, Any]
    classes: list[ControllerClass]

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _resources(value)

    @model_validator(mode="after")
    def _one_active_replica(self) -> Controller:
        # Without the Lease every replica allocates, and two of them hand out the same capacity.
        if self.enabled and self.replicas > 1 and not self.leaderElect:
            raise ValueError(f"replicas: {self.replicas} replicas need leaderElect: true")
        return self


class DeviceClasses(_Model):
    timeSlicingInterval: Literal["Default", "Short", "Medium", "Long"]
    extendedResourceNames: dict[str, str]

    @field_validator("extendedResourceNames")
    @classmethod
    def _extended_resource_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value.values():
            _api(name, names.extended_resource_name, "extended resource name")
        return value


class Switch(_Model):
    enabled: bool


class Dashboard(_Model):
    # Grafana's dashboard sidecar finds ConfigMaps by label, in its own namespace unless told otherwise.
    namespace: str | None = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    label: str = Field(pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    labelValue: str
    folder: str | None
    folderAnnotation: str = Field(pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

    @field_validator("label", "folderAnnotation")
    @classmethod
    def _key(cls, value: str) -> str:
        return _api(value, names.qualified_name, "label or annotation key")

    @field_validator("labelValue")
    @classmethod
    def _label_value(cls, value: str) -> str:
        return _api(value, names.label_value, "label value")


class ServiceAccountRef(_Model):
    namespace: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)


class Metrics(_Model):
    auth: bool
    readers: list[ServiceAccountRef]
    scraperNamespaces: list[Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]]


class Values(_Model):
    namespace: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    image: Image
    logLevel: Literal["debug", "info", "warning", "error"]
    logFormat: Literal["json", "text"]
    kubernetesMinVersion: str

    @field_validator("kubernetesMinVersion", mode="before")
    @classmethod
    def _min_version(cls, value: Any) -> str:
        """`1.38` as written (a YAML float like 1.38 is taken as its text); at least the supported floor."""
        text = str(value)
        version = versions.parse_version(text)
        if version < versions.FLOOR:
            raise ValueError(
                f"{text!r} is older than the oldest supported Kubernetes, {versions.show(versions.FLOOR)}"
            )
        return versions.show(version)

    kubeletPlugin: KubeletPlugin
    controller: Controller
    deviceClasses: DeviceClasses
    metrics: Metrics
    validatingAdmissionPolicy: Switch
    grafanaDashboard: Dashboard


def image_reference(values: Values) -> str:
    """The image every pod of the install runs (and that `make image` builds): repository:tag."""
    return f"{values.image.repository}:{values.image.tag or __version__}"


def merge(base: Any, override: Any) -> Any:
    """Maps merge key by key; anything else in `override` replaces what `base` has."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged
    return override


def default_values_text() -> str:
    return (resources.files("dra_gpu") / TEMPLATES / DEFAULT_VALUES).read_text()


def _describe(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        elif "input" in err and err["type"] not in ("missing", "value_error"):
            message += f" (got {err['input']!r})"
        parts.append(f"{path}: {message}")
    return f"{source}: invalid values: " + "; ".join(parts)


def load_values(path: Path | None = None) -> Values:
    """The defaults, with the file at `path` merged over them."""
    data = yaml.safe_load(default_values_text())
    source = "default values"
    if path is not None:
        source = str(path)
        try:
            override = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ValuesError(f"{path}: cannot read the values file: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ValuesError(f"{path}: not valid YAML: {exc}") from None
        if override is None:
            override = {}
        if not isinstance(override, Mapping):
            raise ValuesError(f"{path}: expected a mapping of values, got {type(override).__name__}")
        data = merge(data, override)
    try:
        return Values.model_validate(data)
    except ValidationError as exc:
        raise ValuesError(_describe(exc, source)) from None
