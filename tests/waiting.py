"""Waiting for something a background thread or process does: one helper, one contract."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout_s: float = 30.0, what: str = "the condition") -> T:
    """Polls until `condition()` returns something truthy, and returns it; raises AssertionError saying what
    was awaited when `timeout_s` passes first. Timeouts are generous: a loaded machine is slow, not wrong,
    and the tests assert outcomes, never the time they took."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.02)
