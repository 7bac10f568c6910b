"""Structured logging: one JSON object per line (for log pipelines) or key=value text (for people)."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """Fields given with `extra={...}` become top-level keys, as in klog's JSON format."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Readable `time level logger msg key=value ...` lines."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extras = " ".join(
            f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
            for k, v in _fields(record).items()
        )
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if extras:
            line += " " + extras
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the time of the record, not when logging was set up.

    Background threads (the slice publisher, the gRPC server) may log after a caller swapped or closed
    the stream it had when `setup_logging` ran (an embedding program, a test's captured output).
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Configure the root logger once for the process (stderr, as containers expect)."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class Throttle:
    """At most one log line per `interval_s` for a condition that can repeat as fast as a client
    makes it (a flood of connections): the first occurrence is logged at once, the next ones are
    counted, and the next line that is let through says how many were held back."""

    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._held = 0

    def allow(self) -> int | None:
        """None: do not log now; otherwise how many occurrences were held back since the last line."""
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            self._held += 1
            return None
        self._last, held, self._held = now, self._held, 0
        return held
