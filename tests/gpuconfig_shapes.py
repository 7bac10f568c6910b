"""GpuConfig shapes a user may write in a claim, and what each of the four judges says of them: the model
(`parse_gpu_config`), the JSON Schema (`api/dra/v1alpha/gpuconfig.schema.json`), the claim admission policies
(their CEL, as the API server runs them at creation) and the node (a real prepare over gRPC).

The shapes: a valid config of every mode, then each of its fields with a value of the wrong JSON type, set to
null, moved one level up and into each sibling section; a `limiter` section under every other strategy; the
strategy left out; percents as a string, a float and an integral float (`50.0`); a compute ceiling with no
floor anywhere (the whole GPU). `python tests/gpuconfig_shapes.py` prints how many shapes the policy admits
and the node refuses (the issue's "Measured" figure) and every disagreement.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cel
import jsonschema  # type: ignore[import-untyped]  # kubernetes-validate's validator, the schemas' own
import yaml
from plugin_harness import NODE, Alloc, Kubelet, PluginDirs, add_claim, opaque, running_plugin, uid_of
from repo_paths import ROOT

from dra_gpu import CONFIG_API_VERSION, CONFIG_KIND, DRIVER_NAME
from dra_gpu.allocator.cel_env import kubernetes_context
from dra_gpu.config import ConfigError, parse_gpu_config
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube import builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.manifests import load_values, render
from dra_gpu.manifests.classes import device_classes, priority_classes
from dra_gpu.vocabulary.device import published_memory

Obj = dict[str, Any]
PROFILE = "3xH100-80GB"
SHARING = "0=Exclusive,1=Shared,2=MPS"
GPUS = SimulatedInventory(PROFILE, seed=NODE).gpus()
CHARGED = {"memory": "8Gi", "cores": "30"}


@dataclass(frozen=True)
class Mode:
    device_class: str
    device: str
    shared: bool


MODES = {
    "Exclusive": Mode(DRIVER_NAME, "gpu-0", False),
    "TimeSlicing": Mode(f"timeslice.{DRIVER_NAME}", "gpu-1", True),
    "Limiter": Mode(f"limiter.{DRIVER_NAME}", "gpu-1", True),
    "MPS": Mode(f"mps.{DRIVER_NAME}", "gpu-2", True),
    "Limiter (latency class)": Mode(f"latency.limiter.{DRIVER_NAME}", "gpu-1", True),
}

VALID: dict[str, Obj] = {
    "Exclusive": {"strategy": "Exclusive"},
    "TimeSlicing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}},
    "MPS": {
        "strategy": "MPS",
        "mps": {
            "defaultActiveThreadPercentage": 30,
            "defaultPinnedDeviceMemoryLimit": "8Gi",
            "runAsUser": 1000,
        },
    },
    "Limiter": {
        "strategy": "Limiter",
        "limiter": {
            "memory": "8Gi",
            "memoryLimit": "8Gi",
            "cores": 30,
            "compute": {"limit": 30, "priority": "standard"},
        },
    },
}
WATCHDOG = {"policy": "Report"}


@dataclass(frozen=True)
class Shape:
    name: str
    mode: str
    """The mode of the request's class (and the GPU it is allocated on)."""
    parameters: Any
    capacity: bool = True
    """Whether the request names its capacities (else it is charged the whole GPU)."""
    alone: bool = True
    """Whether the config alone decides; else it is valid and refused in its claim (its class, its request),
    which the model and the schema, judging a config alone, cannot see."""


def _config(sharing: Obj) -> Obj:
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": CONFIG_KIND,
        "sharing": sharing,
        "watchdog": dict(WATCHDOG),
    }


def _paths(obj: Obj, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in obj.items():
        if prefix == () and key in ("apiVersion", "kind"):
            continue
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _paths(value, (*prefix, key))


def _at(obj: Obj, path: tuple[str, ...]) -> Obj:
    for key in path:
        obj = obj[key]
    return obj


def _wrong(value: Any) -> Any:
    if isinstance(value, dict):
        return "x"
    if isinstance(value, str):
        return True
    return "5"


def shapes() -> list[Shape]:
    out: list[Shape] = []
    for mode, sharing in VALID.items():
        base = _config(sharing)
        out.append(Shape(f"{mode}: valid", mode, base))
        for path in _paths(base):
            where = ".".join(path)
            wrong = copy.deepcopy(base)
            _at(wrong, path[:-1])[path[-1]] = _wrong(_at(base, path[:-1])[path[-1]])
            out.append(Shape(f"{mode}: {where} of the wrong type", mode, wrong))
            null = copy.deepcopy(base)
            _at(null, path[:-1])[path[-1]] = None
            out.append(Shape(f"{mode}: {where} null", mode, null))
            if len(path) >= 2:
                up = copy.deepcopy(base)
                value = _at(up, path[:-1]).pop(path[-1])
                _at(up, path[:-2]).setdefault(path[-1], value)
                if up != base:
                    out.append(Shape(f"{mode}: {where} one level up", mode, up))
            parent = _at(base, path[:-1])
            for sibling, section in parent.items():
                if sibling != path[-1] and isinstance(section, dict):
                    down = copy.deepcopy(base)
                    value = _at(down, path[:-1]).pop(path[-1])
                    _at(down, path[:-1])[sibling][path[-1]] = value
                    out.append(Shape(f"{mode}: {where} under {'.'.join((*path[:-1], sibling))}", mode, down))
        missing = copy.deepcopy(base)
        del missing["sharing"]["strategy"]
        out.append(Shape(f"{mode}: strategy left out", mode, missing))
        if mode != "Limiter":
            stray = copy.deepcopy(base)
            stray["sharing"]["limiter"] = {"compute": {"limit": 50}}
            out.append(Shape(f"{mode}: limiter.compute under {mode}", mode, stray))
    elastic = {"strategy": "Limiter", "limiter": {"compute": {"limit": 100, "priority": "latency"}}}
    out.append(Shape("Limiter (latency class): valid", "Limiter (latency class)", _config(elastic)))
    percents: dict[str, list[tuple[str, ...]]] = {
        "Limiter": [("limiter", "cores")],
        "Limiter (latency class)": [("limiter", "compute", "limit")],
        "MPS": [("mps", "defaultActiveThreadPercentage")],
    }
    for mode, paths in percents.items():
        for path in paths:
            for value in ("30", 30.5, 30.0, 50.0):
                shaped = _config(copy.deepcopy(elastic if "latency" in mode else VALID[mode]))
                if path[-1] == "cores":
                    del shaped["sharing"]["limiter"]["compute"]
                _at(shaped["sharing"], path[:-1])[path[-1]] = value
                out.append(Shape(f"{mode}: {'.'.join(path)} {value!r}", mode, shaped))
    floorless = _config({"strategy": "Limiter", "limiter": {"compute": {"limit": 30}}})
    out.append(
        Shape("Limiter: compute.limit with no cores anywhere", "Limiter", floorless, False, alone=False)
    )
    for mode in MODES:
        bare = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND}
        out.append(Shape(f"{mode}: sharing left out (Exclusive)", mode, bare, alone=mode == "Exclusive"))
        empty = {**bare, "sharing": {}}
        out.append(Shape(f"{mode}: sharing empty (Exclusive)", mode, empty, alone=mode == "Exclusive"))
    return out


# -- the four judges ------------------------------------------------------------------------------------
def model_accepts(shape: Shape) -> bool:
    try:
        parse_gpu_config(shape.parameters)
    except ConfigError:
        return False
    return True


SCHEMA = json.loads((ROOT / "api" / "dra" / "v1alpha" / "gpuconfig.schema.json").read_text())


def schema_accepts(shape: Shape) -> bool:
    return bool(jsonschema.Draft202012Validator(SCHEMA).is_valid(shape.parameters))


def claim_of(shape: Shape) -> Obj:
    mode = MODES[shape.mode]
    capacity = CHARGED if mode.shared and shape.capacity else None
    request = builders.exact_request("gpu", mode.device_class, capacity=capacity)
    config = builders.opaque_config(DRIVER_NAME, shape.parameters)
    return builders.resource_claim("c", [request], configs=[config])


def _policies() -> list[Obj]:
    docs = yaml.safe_load_all(render(load_values())["validatingadmissionpolicy.yaml"])
    return [d for d in docs if d and d["kind"] == "ValidatingAdmissionPolicy" and "resourceclaims" in str(d)]


CLASSES = device_classes(load_values()) + priority_classes()


def policy_answer(shape: Shape) -> list[str]:
    """The messages the API server answers the claim's creation with ([] admits it); a CEL error is answered
    as the error itself (`failurePolicy: Fail`), not a rule's message."""
    obj = claim_of(shape)
    messages: list[str] = []
    for policy in _policies():
        spec = policy["spec"]
        for params in CLASSES if "paramKind" in spec else [None]:
            context = kubernetes_context()
            context.add_variable("object", obj)
            if params is not None:
                context.add_variable("params", params)
            variables: Obj = {}
            try:
                for variable in spec["variables"]:
                    context.add_variable("variables", variables)
                    variables[variable["name"]] = cel.compile(variable["expression"]).execute(context)
                context.add_variable("variables", variables)
                for v in spec["validations"]:
                    if cel.compile(v["expression"]).execute(context) is not True:
                        messages.append(v["message"])
            except Exception as exc:  # the CEL library's evaluation errors
                messages.append(f"CEL error: {exc}")
    return messages


def node_answers(all_shapes: list[Shape]) -> list[str]:
    """Each shape prepared by a real node agent (simulated GPUs) as the scheduler allocated it: "" for a
    prepared claim (then unprepared), else prepare's error."""
    dirs = PluginDirs.create()
    api = FakeKube()
    answers: list[str] = []
    try:
        with running_plugin(dirs, api, inventory=SimulatedInventory(PROFILE, seed=NODE), sharing=SHARING):
            kubelet = Kubelet(dirs.registration_dir)
            kubelet.register()
            for n, shape in enumerate(all_shapes):
                answers.append(_prepare(api, kubelet, shape, n))
            kubelet.close()
    finally:
        dirs.cleanup()
    return answers


def _prepare(api: FakeKube, kubelet: Kubelet, shape: Shape, n: int) -> str:
    mode = MODES[shape.mode]
    gpu = next(g for g in GPUS if g.index == int(mode.device.removeprefix("gpu-")))
    consumed = None
    if mode.shared:
        whole = {"memory": str(published_memory(gpu.memory_bytes)[0]), "cores": "100"}
        consumed = CHARGED if shape.capacity else whole
    share_id = f"00000000-0000-4000-8000-{n:012d}" if mode.shared else None
    (device_class,) = [c for c in CLASSES if objects.name(c) == mode.device_class]
    configs = [opaque(objects.opaque_parameters(c)[1]) for c in objects.class_configs(device_class)]
    configs.append(opaque(shape.parameters, source="FromClaim"))
    claim = add_claim(
        api,
        f"c{n}",
        [Alloc(device=mode.device, share_id=share_id, consumed=consumed)],
        configs,
        class_name=mode.device_class,
    )
    error = str(kubelet.prepare(claim)[uid_of(claim)].error)
    if not error:
        kubelet.unprepare(claim)
    return error


@dataclass(frozen=True)
class Verdicts:
    shape: Shape
    model: bool
    schema: bool
    policy: list[str]
    node: str

    @property
    def agree(self) -> bool:
        """All four give the same answer; for a shape judged in its claim's context, the model and the schema
        (which judge the config alone) accept it and the policy and the node both refuse it."""
        admitted, prepared = not self.policy, not self.node
        if self.cel_error or admitted != prepared:
            return False
        if not self.shape.alone:
            return self.model and self.schema and not admitted
        return self.model == self.schema == admitted

    @property
    def cel_error(self) -> bool:
        return any(m.startswith("CEL error") for m in self.policy)


def judge(all_shapes: list[Shape] | None = None) -> list[Verdicts]:
    all_shapes = shapes() if all_shapes is None else all_shapes
    nodes = node_answers(all_shapes)
    return [
        Verdicts(s, model_accepts(s), schema_accepts(s), policy_answer(s), node)
        for s, node in zip(all_shapes, nodes, strict=True)
    ]


def main() -> int:
    verdicts = judge()
    late = [v for v in verdicts if not v.policy and v.node]
    print(f"GpuConfig shapes: {len(verdicts)}")
    print(f"admitted by the policy and refused on the node: {len(late)} of {len(verdicts)}")
    print(f"refused by a CEL error instead of a rule's message: {sum(v.cel_error for v in verdicts)}")
    print(f"all four agree: {sum(v.agree for v in verdicts)} of {len(verdicts)}")
    for v in verdicts:
        if not v.agree:
            node = "refuses" if v.node else "accepts"
            policy = "refuses" if v.policy else "admits"
            print(
                f"  {v.shape.name}: model {'accepts' if v.model else 'refuses'}, schema "
                f"{'accepts' if v.schema else 'refuses'}, policy {policy}, node {node}"
                + (f" ({v.node[:100]})" if v.node and not v.policy else "")
                + (" [CEL error]" if v.cel_error else "")
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
