"""What every part of the GpuConfig API shares: its one error type and the strict model base."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from dra_gpu.quantity import QuantityError, parse_quantity


class ConfigError(ValueError):
    """The one error a bad GpuConfig produces; the message names the field and what is allowed."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=False)


def positive_quantity(value: Any, field: str) -> str:
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


Percent = Annotated[int, Field(ge=1, le=100)]
