"""What every part of the GpuConfig API shares: its one error type, the strict model base and the value types
whose JSON Schema the claim admission policy's structure checks are generated from (manifests/admission.py):
the model, the schema, the policy and the node accept the same shapes."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from dra_gpu.quantity import QuantityError, parse_quantity


class ConfigError(ValueError):
    """The one error a bad GpuConfig produces; the message names the field and what is allowed."""


class Strict(BaseModel):
    """Unknown fields are refused, values are not coerced, and a field set to null is refused: leaving it out
    says the same, and one spelling is what the schema and the admission policy can check alike."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=False)

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = [key for key, value in data.items() if value is None]
            if nulls:
                raise ValueError(f"{nulls[0]} is null; leave the field out instead")
        return data


def positive_quantity(value: Any, field: str) -> str:
    value = whole(value)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{field} must be a quantity such as '10Gi' or an integer number of bytes")
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from exc
    if amount <= 0:
        raise ValueError(f"{field} must be positive, got {value!r}")
    return str(value)


E = TypeVar("E", bound=StrEnum)


def one_of(enum: type[E], value: Any, what: str) -> E:
    """`value` as a member of `enum`, or the one-line error naming `what` and the allowed values."""
    allowed = [member.value for member in enum]
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; allowed: {', '.join(allowed)}")
    return enum(value)


def whole(value: Any) -> Any:
    """JSON has one number type: `50.0` is the number 50 (the JSON Schema's `integer` accepts it), so a float
    without a fraction is that integer; any other float or a bool stays what it is, and is refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Percent = Annotated[int, Field(ge=1, le=100), BeforeValidator(whole)]

QUANTITY_PATTERN = (
    r"^\+?(?=[0-9.]*[1-9])(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A positive Kubernetes quantity (the API's own pattern, without a sign or zero)."""
Quantity = Annotated[
    str,
    WithJsonSchema(
        {"anyOf": [{"type": "string", "pattern": QUANTITY_PATTERN}, {"type": "integer", "minimum": 1}]}
    ),
]
"""A positive quantity as a string (`10Gi`), or an integer number of bytes."""
