"""The shape of a GpuConfig in a claim, checked by the claim admission policy with CEL generated from the
GpuConfig's JSON Schema (`config/claim.py` `json_schema`, itself generated from the models), so that the
model, the schema, the policy and the node accept the same shapes.

One check per object of the schema, with its own message: the fields it takes and what each must be, nothing
else, no null. A JSON number without a fraction is a whole number (`50.0` is 50, as in the schema); a quantity
is what the API server's `isQuantity` takes, positive, or a number of bytes. The claim policy's other rules
read only the configs that pass (`gpuConfigs`), so no shape makes their CEL fail instead of its own message.
"""

from __future__ import annotations

import json
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.config import json_schema
from dra_gpu.config.claim import SECTIONS

Obj = dict[str, Any]

STRUCTURE = json_schema()


def _resolve(node: Obj) -> Obj:
    ref = node.get("$ref")
    return STRUCTURE["$defs"][ref.rsplit("/", 1)[-1]] if isinstance(ref, str) else node


def _whole_number(v: str, low: int, high: int) -> str:
    """An integer in range, or a float without a fraction in range (JSON's `50.0` is the number 50)."""
    return (
        f"(type({v}) == int && {v} >= {low} && {v} <= {high}) || "
        f"(type({v}) == double && {v} >= {float(low)} && {v} <= {float(high)} && {v} == double(int({v})))"
    )


def _value_check(node: Obj, v: str) -> tuple[str, str]:
    """(CEL that holds where `v` fits the schema `node`, what `v` must be in words)."""
    node = _resolve(node)
    if "anyOf" in node:  # a quantity (config/base.py Quantity): the API's own check of one, positive
        return (
            f"(type({v}) == string && isQuantity({v}) && quantity({v}).sign() > 0) || (type({v}) == int && {v} >= 1) "
            f"|| (type({v}) == double && {v} >= 1.0 && {v} <= {float(2**53)} && {v} == double(int({v})))",
            "a positive quantity such as 10Gi, or a number of bytes",
        )
    if node.get("type") == "object":
        return f"type({v}) == map", "an object"
    if "const" in node:
        return f"type({v}) == string && {v} == {json.dumps(node['const'])}", json.dumps(node["const"])
    if "enum" in node:
        return f"type({v}) == string && {v} in {json.dumps(node['enum'])}", "one of " + ", ".join(
            node["enum"]
        )
    if node.get("type") == "integer":
        low, high = node.get("minimum", 0), node.get("maximum", 2**53)
        return _whole_number(v, low, high), f"a whole number {low}..{high}"
    return f"type({v}) == string", "a string"


def _objects(node: Obj, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Obj]]:
    """Every object of the schema with its path from the GpuConfig, parents first."""
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        if _resolve(child).get("type") == "object":
            found += _objects(_resolve(child), (*path, name))
    return found


def _shape_check(path: tuple[str, ...], node: Obj) -> tuple[str, str]:
    """(CEL that holds where the config `c` has no object at `path` or a well-formed one, the message)."""
    where = "c.opaque.parameters" + "".join(f".{p}" for p in path)
    present = [f"has(c.opaque.parameters{''.join(f'.{p}' for p in path[: i + 1])})" for i in range(len(path))]
    # An object that is absent, or not an object (its parent's check says so), is not judged here.
    guard = " && ".join(f"{has} && type({has[4:-1]}) == map" for has in present)
    fields = node.get("properties", {})
    checks = [] if path else [f"type({where}) == map"]
    checks.append(f"{where}.all(k, k in {json.dumps(list(fields))})")
    checks += [f"has({where}.{name})" for name in node.get("required", [])]
    words = []
    for name, child in fields.items():
        check, what = _value_check(child, f"{where}.{name}")
        checks.append(f"!has({where}.{name}) || ({check})")
        words.append(f"{name} ({what})")
    if path == ("sharing",):
        for section, strategy in SECTIONS.items():
            checks.append(
                f'!has({where}.{section}) || (has({where}.strategy) && {where}.strategy == "{strategy.value}")'
            )
        words.append("a section only under its own strategy (strategy left out is Exclusive)")
    expression = " && ".join(f"({c})" for c in checks)
    name = ".".join(path) or "the GpuConfig"
    required = f"; {', '.join(node['required'])} required" if node.get("required") else ""
    message = (
        f"a {DRIVER_NAME} GpuConfig in the claim is malformed at {name}: it takes {', '.join(words)}{required}, "
        f"nothing else, and no null (leave a field out instead); see api/dra/v1alpha/gpuconfig.schema.json"
    )
    return (f"!({guard}) || ({expression})" if guard else expression), message


def shape_checks() -> list[tuple[str, str]]:
    """One check per object of the GpuConfig schema, generated from it (config/claim.py json_schema), and its
    message: the policy admits the shapes the schema and the model accept."""
    return [_shape_check(path, node) for path, node in _objects(STRUCTURE)]


def gpu_configs_variable() -> Obj:
    """The claim's well-formed configs of this driver: the other rules read only these, so that no shape makes
    a rule's CEL fail instead of the shape's own message."""
    checks = " && ".join(f"({check})" for check, _ in shape_checks())
    return {
        "name": "gpuConfigs",
        "expression": f'variables.configs.filter(c, has(c.opaque) && c.opaque.driver == "{DRIVER_NAME}" && {checks})',
    }


def shape_validations() -> list[Obj]:
    """A config of this driver is a well-formed GpuConfig, each object of it checked with its own message."""
    ours = f'!(has(c.opaque) && c.opaque.driver == "{DRIVER_NAME}")'
    return [
        {
            "expression": f"variables.configs.all(c, {ours} || ({check}))",
            "message": message,
            "reason": "Invalid",
        }
        for check, message in shape_checks()
    ]
