"""The opaque configuration API, `gpu.dra-gpu.io/v1alpha1` `GpuConfig`, and how configs merge.

DeviceClasses and claims carry a GpuConfig in `opaque.parameters`; the API server does not look
inside, so every check a user relies on happens here. The models are the one source of truth: they
generate the JSON Schema in `api/dra/v1alpha/` and are what the kubelet plugin, the controller and
the DeviceClasses use.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
from dra_gpu.config.base import ConfigError, Percent, Quantity, Strict, one_of, positive_quantity, whole
from dra_gpu.config.placement import Placement
from dra_gpu.limiter_abi.limits import DEFAULT_PRIORITY, Priority
from dra_gpu.quantity import to_int


class Strategy(StrEnum):
    EXCLUSIVE = "Exclusive"
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"
    LIMITER = "Limiter"


class TimeSlicingConfig(Strict):
    """GPU-wide time slice (`nvidia-smi compute-policy --set-timeslice`); shared by every claim on the GPU."""

    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


class MpsConfig(Strict):
    """Defaults for MPS clients when the claim's allocation carries no consumed capacity, and the UID
    the claim's pods run as.

    `runAsUser`: the GPU's MPS control daemon serves one UID at a time (one server per UID), so
    claims whose pods run as different UIDs would queue behind each other; the node refuses a claim
    declaring a UID other than the one the GPU's MPS claims declared.
    """

    defaultActiveThreadPercentage: Percent | None = None
    defaultPinnedDeviceMemoryLimit: Quantity | None = None
    runAsUser: Annotated[int, Field(ge=0, le=4294967294), BeforeValidator(whole)] | None = None

    @field_validator("defaultPinnedDeviceMemoryLimit", mode="before")
    @classmethod
    def _memory(cls, v: Any) -> Any:
        return None if v is None else positive_quantity(v, "defaultPinnedDeviceMemoryLimit")


class ComputeConfig(Strict):
    """Elastic compute of a limiter share: `cores` is the floor, guaranteed under contention;
    `limit` the ceiling it may borrow idle time up to (unset: the floor, a fixed share); `priority`
    its class in the GPU's arbitration."""

    limit: Percent | None = None
    priority: Priority = DEFAULT_PRIORITY

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, v: Any) -> Any:
        return one_of(Priority, v, "compute priority")


class LimiterConfig(Strict):
    """Limits for API servers without consumable capacity; consumed capacity wins when present.

    `memory` (or the consumed `memory` capacity) is the request: the guaranteed share, the driver's
    soft limit. `memoryLimit` is the ceiling: the driver's hard limit and the limiter's claim-wide
    budget; unset, the ceiling is the request. `cores` (or the consumed `cores` capacity) is the
    compute floor; `compute` its ceiling and priority class.
    """

    memory: Quantity | None = None
    memoryLimit: Quantity | None = None
    cores: Percent | None = None
    compute: ComputeConfig | None = None

    @field_validator("memory", "memoryLimit", mode="before")
    @classmethod
    def _memory(cls, v: Any, info: Any) -> Any:
        return None if v is None else positive_quantity(v, info.field_name)

    @model_validator(mode="after")
    def _limit_not_below_request(self) -> LimiterConfig:
        request, limit = self.memory_bytes(), self.memory_limit_bytes()
        if request is not None and limit is not None and limit < request:
            raise ValueError(
                f"memoryLimit {self.memoryLimit} is below memory {self.memory}; the limit is the ceiling "
                f"and must be at least the request: raise memoryLimit or lower memory"
            )
        ceiling = self.compute.limit if self.compute is not None else None
        if ceiling is not None and self.cores is not None and ceiling < self.cores:
            raise ValueError(
                f"compute.limit {ceiling} is below cores {self.cores}; cores is the guaranteed floor and "
                f"the limit the ceiling above it: raise compute.limit or lower cores"
            )
        return self

    def memory_bytes(self) -> int | None:
        return None if self.memory is None else to_int(self.memory)

    def memory_limit_bytes(self) -> int | None:
        return None if self.memoryLimit is None else to_int(self.memoryLimit)


SECTIONS = {"timeSlicing": Strategy.TIME_SLICING, "mps": Strategy.MPS, "limiter": Strategy.LIMITER}
"""The settings section of each strategy that has one; a section under another strategy is refused."""


class Sharing(Strict):
    strategy: Strategy = Strategy.EXCLUSIVE
    timeSlicing: TimeSlicingConfig | None = None
    mps: MpsConfig | None = None
    limiter: LimiterConfig | None = None

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy(cls, v: Any) -> Any:
        allowed = [s.value for s in Strategy]
        if v not in allowed:
            raise ValueError(f"unknown sharing strategy {v!r}; allowed: {', '.join(allowed)}")
        return Strategy(v)

    @model_validator(mode="after")
    def _section_matches_strategy(self) -> Sharing:
        for name, strategy in SECTIONS.items():
            if getattr(self, name) is not None and self.strategy != strategy:
                raise ValueError(
                    f"sharing.{name} is set but sharing.strategy is {self.strategy.value}; "
                    f"set strategy: {strategy.value} or remove sharing.{name}"
                )
        return self


class WatchdogPolicy(StrEnum):
    REPORT = "Report"
    TERMINATE = "Terminate"


class Watchdog(Strict):
    """What the node agent does with a process that escapes its claim's share (it always reports it):
    `Report` only, or `Terminate` the offending process (never a process of another claim)."""

    policy: WatchdogPolicy = WatchdogPolicy.REPORT

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, v: Any) -> Any:
        return one_of(WatchdogPolicy, v, "watchdog policy")


class GpuConfig(Strict):
    """`apiVersion: gpu.dra-gpu.io/v1alpha1`, `kind: GpuConfig`."""

    apiVersion: Literal["gpu.dra-gpu.io/v1alpha1"]
    kind: Literal["GpuConfig"]
    sharing: Sharing = Field(default_factory=Sharing)
    placement: Placement | None = None
    watchdog: Watchdog | None = None

    @classmethod
    def default(cls) -> GpuConfig:
        return cls.model_validate({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND})

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


_FIELDS_HINT = {
    (): "apiVersion, kind, sharing, placement, watchdog",
    ("sharing",): "strategy, timeSlicing, mps, limiter",
    ("sharing", "timeSlicing"): "interval",
    ("sharing", "mps"): "defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, runAsUser",
    ("sharing", "limiter"): "memory, memoryLimit, cores, compute",
    ("sharing", "limiter", "compute"): "limit, priority",
    ("placement",): "policy, affinityLabel, antiAffinityLabel, exclusionLabel",
    ("watchdog",): "policy",
}


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        path = ".".join(loc) or "GpuConfig"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = _FIELDS_HINT.get(loc[:-1], "")
            msg = f"unknown field; allowed fields here: {allowed}" if allowed else "unknown field"
        elif err["type"] == "literal_error" and loc in (("apiVersion",), ("kind",)):
            msg = f"must be {CONFIG_API_VERSION!r}" if loc == ("apiVersion",) else f"must be {CONFIG_KIND!r}"
        if "input" in err and err["type"] not in ("missing", "extra_forbidden", "value_error"):
            msg += f" (got {err['input']!r})"
        parts.append(f"{path}: {msg}")
    return "invalid GpuConfig: " + "; ".join(parts)


def parse_gpu_config(data: Any) -> GpuConfig:
    """Validate one opaque parameters object; raise ConfigError (and only ConfigError)."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise ConfigError(f"invalid GpuConfig: not JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"invalid GpuConfig: expected an object, got {type(data).__name__}")
    try:
        return GpuConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(f"invalid GpuConfig: {exc}") from None


def _without_nulls(node: Any) -> Any:
    """The models refuse a field set to null (`Strict`): `X | None` is published as X, without a null default."""
    if isinstance(node, dict):
        options = node.get("anyOf")
        if isinstance(options, list) and {"type": "null"} in options:
            rest = [o for o in options if o != {"type": "null"}]
            node = {
                **{k: v for k, v in node.items() if k != "anyOf"},
                **(rest[0] if len(rest) == 1 else {"anyOf": rest}),
            }
        return {k: _without_nulls(v) for k, v in node.items() if not (k == "default" and v is None)}
    if isinstance(node, list):
        return [_without_nulls(v) for v in node]
    return node


def json_schema() -> dict[str, Any]:
    """The JSON Schema published in `api/dra/v1alpha/`, generated from the models above; what the models check
    across fields and the schema can say too (a section only under its strategy, Exclusive when left out) is
    added here."""
    schema: dict[str, Any] = _without_nulls(GpuConfig.model_json_schema())
    schema["$defs"]["Sharing"]["allOf"] = [
        {
            "if": {"not": {"required": ["strategy"], "properties": {"strategy": {"const": strategy.value}}}},
            "then": {"not": {"required": [section]}},
        }
        for section, strategy in SECTIONS.items()
    ]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://{DRIVER_NAME}/v1alpha1/gpuconfig.schema.json"
    return schema


def _request_matches(config_requests: Iterable[str], request: str) -> tuple[bool, bool]:
    """(applies, specific): an empty list applies to every request; `req` also covers `req/sub`."""
    names = list(config_requests)
    if not names:
        return True, False
    base = request.split("/", 1)[0]
    return (request in names or base in names), True


def merge_configs(configs: Iterable[Mapping[str, Any]], request: str, driver: str = DRIVER_NAME) -> GpuConfig:
    """The effective GpuConfig of one allocated request, as Kubernetes defines the precedence.

    `configs` is `status.allocation.devices.config` (class entries first, then claim entries).
    From lowest to highest precedence: class configs for all requests, class configs naming the
    request, claim configs for all requests, claim configs naming the request; within one rank the
    later entry wins. The most specific config wins as a whole, so a claim config is never half
    merged with a class config of another strategy. Other drivers' configs are ignored. Any invalid
    config that applies raises ConfigError naming its source, even if a more specific one overrides it.
    """
    best: tuple[int, int] | None = None
    chosen: GpuConfig | None = None
    for position, entry in enumerate(configs):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        applies, specific = _request_matches(entry.get("requests") or [], request)
        if not applies:
            continue
        source = entry.get("source", "FromClaim")
        try:
            parsed = parse_gpu_config(opaque.get("parameters"))
        except ConfigError as exc:
            raise ConfigError(f"{source} config #{position} for request {request!r}: {exc}") from None
        rank = (1 if source == "FromClaim" else 0, 1 if specific else 0)
        if best is None or rank >= best:
            best, chosen = rank, parsed
    return chosen if chosen is not None else GpuConfig.default()
