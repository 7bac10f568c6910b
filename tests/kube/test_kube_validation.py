"""The fake API server's validator refuses what the real one refuses: one case per upstream rule.

Each case breaks one rule of `pkg/apis/resource/validation` (1.36/1.37) in an otherwise valid object, and
the validator must name that field; the valid objects pass. The 1.36 server's own words for some of these
rules are in tests/fixtures/k8s-1.36-real/slice-validation-errors.txt.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dra_gpu.devicekinds.gpu import fit
from dra_gpu.kube import builders
from dra_gpu.kube.errors import Invalid
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.validation import device_class_errors, slice_errors
from dra_gpu.vocabulary.device import MAX_STRING

Obj = dict[str, Any]


def valid_slice() -> Obj:
    device = {
        "name": "gpu-0",
        "attributes": {"productName": {"string": "NVIDIA H100"}, "index": {"int": 0}},
        "capacity": {
            "memory": {
                "value": "80Gi",
                "requestPolicy": {
                    "default": "80Gi",
                    "validRange": {"min": "256Mi", "max": "80Gi", "step": "256Mi"},
                },
            }
        },
        "allowMultipleAllocations": True,
    }
    spec = builders.slice_spec(
        "gpu.dra-gpu.io", "node-1", "node-1", devices=[device], generation=1, slice_count=1
    )
    return builders.resource_slice(spec, name="node-1-gpu.dra-gpu.io-abcde")


def counter_slice() -> Obj:
    obj = valid_slice()
    obj["spec"].pop("devices")
    obj["spec"]["sharedCounters"] = [{"name": "gpu-0-mig", "counters": {"memory-slice-0": {"value": "1"}}}]
    return obj


def device(obj: Obj) -> Obj:
    d: Obj = obj["spec"]["devices"][0]
    return d


def policy(obj: Obj) -> Obj:
    p: Obj = device(obj)["capacity"]["memory"]["requestPolicy"]
    return p


def many_devices(n: int, **extra: Any) -> Callable[[Obj], object]:
    def mutate(obj: Obj) -> None:
        obj["spec"]["devices"] = [
            {"name": f"gpu-{i}", "attributes": {"index": {"int": i}}, **extra} for i in range(n)
        ]

    return mutate


def setter(path: str, value: Any) -> Callable[[Obj], object]:
    """`spec.pool.generation` = value, `device.attributes.x` = value ('device' is devices[0])."""

    def mutate(obj: Obj) -> None:
        keys = path.split(".")
        node = device(obj) if keys[0] == "device" else obj
        for key in keys[1 if keys[0] == "device" else 0 : -1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value

    return mutate


def consumes(entries: list[Obj]) -> Callable[[Obj], object]:
    return setter("device.consumesCounters", entries)


SLICE_RULES: list[tuple[str, Callable[[Obj], object], str]] = [
    ("name not a DNS subdomain", setter("metadata", {"name": "Node_1"}), "metadata.name: Invalid value"),
    ("neither name nor generateName", setter("metadata", {}), "metadata.name: Required value"),
    ("generateName not a prefix", setter("metadata", {"generateName": "Bad_"}), "metadata.generateName"),
    ("driver over 63 bytes", setter("spec.driver", "a" * 60 + ".example.com"), "spec.driver: Too long"),
    ("driver not a DNS subdomain", setter("spec.driver", "gpu_driver"), "spec.driver: Invalid value"),
    ("pool name not DNS subdomains", setter("spec.pool.name", "node-1/Bad_Part"), "spec.pool.name: Invalid"),
    (
        "pool name over 253 bytes",
        setter("spec.pool.name", "/".join(["a" * 60] * 5)),
        "spec.pool.name: Too long",
    ),
    ("negative generation", setter("spec.pool.generation", -1), "spec.pool.generation: Invalid value: -1"),
    ("no slice count", setter("spec.pool.resourceSliceCount", 0), "resourceSliceCount: Invalid value: 0"),
    ("nodeName not a DNS subdomain", setter("spec.nodeName", "Node_1"), "spec.nodeName: Invalid value"),
    ("empty nodeName", setter("spec.nodeName", ""), "must be either unset or set to a non-empty string"),
    (
        "nodeSelector with two terms",
        lambda o: (o["spec"].pop("nodeName"), o["spec"].update(nodeSelector={"nodeSelectorTerms": [{}, {}]})),
        "must have exactly one node selector term",
    ),
    (
        "allNodes false",
        lambda o: (o["spec"].pop("nodeName"), o["spec"].update(allNodes=False)),
        "spec.allNodes: Invalid value: false",
    ),
    ("nodeName and allNodes", setter("spec.allNodes", True), "but multiple fields are set"),
    ("no node selection", lambda o: o["spec"].pop("nodeName"), "spec: Required value: exactly one of"),
    ("129 devices", many_devices(129), "spec.devices: Too many: 129: must have at most 128 items"),
    (
        "65 tainted devices",
        many_devices(65, taints=[{"key": "a", "effect": "NoSchedule"}]),
        "at most 64 items",
    ),
    (
        "65 devices with a list attribute",
        many_devices(65, attributes={"models": {"strings": ["a"]}}),
        "spec.devices: Too many: 65: must have at most 64 items",
    ),
    ("duplicate device", lambda o: o["spec"]["devices"].append(copy.deepcopy(device(o))), "Duplicate value"),
    (
        "device name not a label",
        setter("device.name", "GPU_0"),
        'spec.devices[0].name: Invalid value: "GPU_0"',
    ),
    (
        "attribute name",
        setter("device.attributes.Bad_Name!", {"int": 1}),
        'attributes: Invalid value: "Bad_Name!"',
    ),
    (
        "attribute name over 32 bytes",
        setter("device.attributes." + "a" * 33, {"int": 1}),
        "attributes: Too long",
    ),
    ("attribute domain", setter("device.attributes.Bad_Domain/x", {"int": 1}), "attributes: Invalid value"),
    ("two values", setter("device.attributes.index", {"int": 1, "string": "x"}), "exactly one value"),
    (
        "string of 33 two-byte characters",
        setter("device.attributes.productName", {"string": "ä" * 33}),
        "attributes[productName].string: Too long: may not be more than 64 bytes",
    ),
    ("bad version", setter("device.attributes.driver", {"version": "580.95.05"}), "semver.org spec 2.0.0"),
    (
        "empty list attribute",
        setter("device.attributes.models", {"strings": []}),
        "models].strings: Required",
    ),
    (
        "49 list values",
        setter("device.attributes.models", {"ints": list(range(49))}),
        "ints: Too many: 49: must have at most 48 items",
    ),
    (
        "bad capacity value",
        setter("device.capacity.cores", {"value": "lots"}),
        "capacity[cores].value: Invalid",
    ),
    (
        "request policy on an exclusive device",
        setter("device.allowMultipleAllocations", False),
        "requestPolicy: Forbidden: allowMultipleAllocations must be true",
    ),
    (
        "validValues and validRange",
        lambda o: policy(o).update(validValues=["1Gi"]),
        'cannot specify "validValues" and "validRange"',
    ),
    (
        "unsorted validValues",
        lambda o: (policy(o).pop("validRange"), policy(o).update(validValues=["2Gi", "1Gi"], default="1Gi")),
        'validValues[1]: Invalid value: "1Gi": values must be sorted in ascending order',
    ),
    (
        "11 validValues",
        lambda o: (
            policy(o).pop("validRange"),
            policy(o).update(validValues=[f"{i}Gi" for i in range(1, 12)], default="1Gi"),
        ),
        "validValues: Too many: 11: must have at most 10 items",
    ),
    (
        "validValue above capacity",
        lambda o: (policy(o).pop("validRange"), policy(o).update(validValues=["1Gi", "90Gi"], default="1Gi")),
        'validValues[1]: Invalid value: "90Gi": option is larger than capacity value: 80Gi',
    ),
    (
        "default not a validValue",
        lambda o: (policy(o).pop("validRange"), policy(o).update(validValues=["1Gi", "2Gi"], default="3Gi")),
        "default value is not valid according to the requestPolicy",
    ),
    ("no default", lambda o: policy(o).pop("default"), "requestPolicy.default: Required value"),
    ("no min", lambda o: policy(o)["validRange"].pop("min"), "validRange.min: Required value"),
    (
        "negative min",
        lambda o: policy(o)["validRange"].update(min="-1Gi"),
        'validRange.min: Invalid value: "-1Gi": must be greater than or equal to 0',
    ),
    (
        "default above max",
        setter("device.capacity.memory.requestPolicy.default", "100Gi"),
        "default is more than max",
    ),
    (
        "min above max",
        lambda o: policy(o)["validRange"].update(min="80Gi", max="1Gi"),
        "min is larger than max: 1Gi",
    ),
    ("zero step", lambda o: policy(o)["validRange"].update(step="0"), 'validRange.step: Invalid value: "0"'),
    (
        "one step above capacity",
        lambda o: policy(o)["validRange"].update(min="80Gi", step="256Mi"),
        "one step",
    ),
    (
        "default off the step",
        setter("device.capacity.memory.requestPolicy.default", "1000Mi"),
        "value is not a multiple of a given step (256Mi) from (256Mi)",
    ),
    (
        "17 taints",
        setter("device.taints", [{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]),
        "taints: Too many: 17: must have at most 16 items",
    ),
    ("taint key", setter("device.taints", [{"key": "bad key", "effect": "NoSchedule"}]), "taints[0].key"),
    (
        "taint value",
        setter("device.taints", [{"key": "k", "value": "bad value", "effect": "None"}]),
        "taints[0].value",
    ),
    (
        "taint effect",
        setter("device.taints", [{"key": "k", "effect": "PreferNoSchedule"}]),
        'Unsupported value: "PreferNoSchedule"',
    ),
    ("taint without effect", setter("device.taints", [{"key": "k"}]), "taints[0].effect: Required value"),
    (
        "duplicate counterSet",
        consumes([{"counterSet": "a", "counters": {"c": {"value": "1"}}}] * 2),
        'consumesCounters[1]: Duplicate value: "a"',
    ),
    (
        "counterSet not a label",
        consumes([{"counterSet": "Bad_Set", "counters": {"c": {"value": "1"}}}]),
        "consumesCounters[0].counterSet: Invalid value",
    ),
    (
        "empty consumption",
        consumes([{"counterSet": "a", "counters": {}}]),
        "consumesCounters[0].counters: Required",
    ),
    (
        "three consumptions",
        consumes([{"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)]),
        "Too many: 3",
    ),
    (
        "per-device nodeName without the flag",
        setter("device.nodeName", "node-1"),
        "can only be set if `perDeviceNodeSelection`",
    ),
    (
        "per-device node selection without a choice",
        lambda o: (o["spec"].pop("nodeName"), o["spec"].update(perDeviceNodeSelection=True)),
        "spec.devices[0]: Required value: exactly one of `nodeName`, `nodeSelector`, or `allNodes`",
    ),
    (
        "binding conditions without failure conditions",
        setter("device.bindingConditions", ["Attached"]),
        "bindingFailureConditions are required to use bindingConditions",
    ),
    (
        "failure conditions without binding conditions",
        setter("device.bindingFailureConditions", ["Failed"]),
        "bindingConditions are required to use bindingFailureConditions",
    ),
    (
        "overlapping binding conditions",
        lambda o: device(o).update(bindingConditions=["Ready"], bindingFailureConditions=["Ready"]),
        "must not overlap with bindingConditions",
    ),
    (
        "five binding conditions",
        lambda o: device(o).update(
            bindingConditions=[f"c{i}" for i in range(5)], bindingFailureConditions=["f"]
        ),
        "bindingConditions: Too many: 5: must have at most 4 items",
    ),
]

COUNTER_RULES: list[tuple[str, Callable[[Obj], object], str]] = [
    (
        "devices and counters",
        lambda o: o["spec"].update(devices=[]),
        "only one of `sharedCounters` or `devices`",
    ),
    (
        "empty counter set",
        lambda o: o["spec"]["sharedCounters"][0].update(counters={}),
        "sharedCounters[0].counters: Required",
    ),
    (
        "counter set without a name",
        lambda o: o["spec"]["sharedCounters"][0].pop("name"),
        "sharedCounters[0].name: Required",
    ),
    (
        "duplicate counter set",
        lambda o: o["spec"]["sharedCounters"].append(copy.deepcopy(o["spec"]["sharedCounters"][0])),
        'sharedCounters[1]: Duplicate value: "gpu-0-mig"',
    ),
    (
        "nine counter sets",
        lambda o: o["spec"].update(
            sharedCounters=[{"name": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(9)]
        ),
        "sharedCounters: Too many: 9",
    ),
    (
        "33 counters",
        lambda o: o["spec"]["sharedCounters"][0].update(
            counters={f"c{i}": {"value": "1"} for i in range(33)}
        ),
        "counters: Too many: 33",
    ),
    (
        "counter name",
        lambda o: o["spec"]["sharedCounters"][0].update(counters={"Bad_Counter": {"value": "1"}}),
        "counters[Bad_Counter]: Invalid value",
    ),
]


def test_the_valid_objects_pass() -> None:
    assert slice_errors(valid_slice()) == []
    assert slice_errors(counter_slice()) == []


@pytest.mark.parametrize(("rule", "mutate", "expected"), SLICE_RULES, ids=[r[0] for r in SLICE_RULES])
def test_a_slice_that_breaks_one_rule_is_refused_naming_the_field(
    rule: str, mutate: Callable[[Obj], object], expected: str
) -> None:
    obj = valid_slice()
    mutate(obj)
    errors = slice_errors(obj)
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(("rule", "mutate", "expected"), COUNTER_RULES, ids=[r[0] for r in COUNTER_RULES])
def test_a_counter_slice_that_breaks_one_rule_is_refused(
    rule: str, mutate: Callable[[Obj], object], expected: str
) -> None:
    obj = counter_slice()
    mutate(obj)
    assert any(expected in e for e in slice_errors(obj)), slice_errors(obj)


def test_the_fake_api_server_refuses_them() -> None:
    obj = valid_slice()
    device(obj)["attributes"]["productName"] = {"string": "ä" * 33}
    with pytest.raises(Invalid, match="may not be more than 64 bytes"):
        FakeKube().create("ResourceSlice", obj)


def test_an_upper_case_driver_is_accepted_as_upstream_lower_cases_it() -> None:
    obj = valid_slice()
    obj["spec"]["driver"] = "GPU.example.com"
    assert slice_errors(obj) == []


def test_published_strings_are_cut_to_64_bytes_not_characters() -> None:
    name = "NVIDIA H100 " + "ä" * 40  # 92 bytes
    cut = fit(name)
    assert len(cut.encode()) <= MAX_STRING and name.startswith(cut) and cut.endswith("ä")


def valid_class() -> Obj:
    return builders.device_class(
        "gpu.dra-gpu.io",
        ['device.driver == "gpu.dra-gpu.io"'],
        [builders.opaque_config("gpu.dra-gpu.io", {"kind": "GpuConfig"})],
    )


CLASS_RULES: list[tuple[str, Callable[[Obj], object], str]] = [
    ("name", setter("metadata", {"name": "GPU"}), "metadata.name: Invalid value"),
    (
        "33 selectors",
        lambda o: o["spec"].update(selectors=[{"cel": {"expression": "true"}}] * 33),
        "selectors: Too many: 33",
    ),
    (
        "empty expression",
        lambda o: o["spec"].update(selectors=[{"cel": {}}]),
        "selectors[0].cel.expression: Required",
    ),
    (
        "config driver",
        lambda o: o["spec"]["config"][0]["opaque"].update(driver="gpu_x"),
        "opaque.driver: Invalid",
    ),
    (
        "parameters not an object",
        lambda o: o["spec"]["config"][0]["opaque"].update(parameters=[1]),
        "must be a valid JSON object",
    ),
    (
        "parameters over 10 KiB",
        lambda o: o["spec"]["config"][0]["opaque"].update(parameters={"x": "a" * 10240}),
        "Too long",
    ),
    (
        "extended resource name",
        lambda o: o["spec"].update(extendedResourceName="gpu"),
        "must be a valid extended resource name",
    ),
    (
        "kubernetes.io extended resource",
        lambda o: o["spec"].update(extendedResourceName="kubernetes.io/gpu"),
        "extendedResourceName",
    ),
]


@pytest.mark.parametrize(("rule", "mutate", "expected"), CLASS_RULES, ids=[r[0] for r in CLASS_RULES])
def test_a_device_class_that_breaks_one_rule_is_refused(
    rule: str, mutate: Callable[[Obj], object], expected: str
) -> None:
    obj = valid_class()
    assert device_class_errors(obj) == []
    mutate(obj)
    assert any(expected in e for e in device_class_errors(obj)), device_class_errors(obj)
    with pytest.raises(Invalid):
        FakeKube().create("DeviceClass", obj)
