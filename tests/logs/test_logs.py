"""Structured logs: one JSON object per line with the caller's fields, to the current stderr."""

from __future__ import annotations

import io
import json
import logging

import pytest

from dra_gpu.logs import Throttle, setup_logging


def test_json_lines_carry_the_fields_given_with_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    setup_logging("info", "json")
    logging.getLogger("dra_gpu.test").info("claim prepared", extra={"claim": "default/a", "devices": 2})
    logging.getLogger("dra_gpu.test").debug("not shown at info")
    entries = [json.loads(line) for line in err.getvalue().splitlines()]
    assert len(entries) == 1
    assert entries[0]["msg"] == "claim prepared"
    assert entries[0]["level"] == "info"
    assert entries[0]["claim"] == "default/a" and entries[0]["devices"] == 2


def test_a_closed_stream_from_setup_time_does_not_break_later_logging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A background thread logging after its original stderr was closed must still be heard."""
    first = io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    setup_logging("info", "text")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr("sys.stderr", second)
    logging.getLogger("dra_gpu.test").warning("still heard", extra={"node": "n1"})
    assert "still heard node=n1" in second.getvalue()


def test_a_throttle_lets_one_line_through_per_interval_and_counts_the_others() -> None:
    now = [100.0]
    throttle = Throttle(interval_s=10.0, clock=lambda: now[0])
    assert throttle.allow() == 0, "the first occurrence is logged at once"
    for _ in range(5000):  # a client making the agent fail as fast as it can
        assert throttle.allow() is None
    now[0] += 10.0
    assert throttle.allow() == 5000, "the next line says how many were held back"
    assert throttle.allow() is None
