"""The per-claim failure: its message goes verbatim into the pod's events through the kubelet."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

MAX_QUOTE = 64
"""The most characters of a value from a request or an object that a message repeats."""
MAX_TOKEN = 160
"""A run of non-blank characters longer than this in a message is a value someone sent: cut."""
MAX_MESSAGE = 2048
"""The most characters of one claim's error (it goes into events, logs and the kubelet's answer)."""
_LONG_TOKEN = re.compile(rf"\S{{{MAX_TOKEN + 1},}}")


class PrepareError(Exception):
    """A claim cannot be prepared or unprepared; ``reason`` is the short label used in metrics."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason

    def __str__(self) -> str:
        return self.message


def short(value: object, limit: int = MAX_QUOTE) -> str:
    """`value` for a message, cut to its first `limit` characters (saying how many more there were)."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def quote(value: object, limit: int = MAX_QUOTE) -> str:
    """`value` quoted for a message, cut to its first `limit` characters (saying how many more there are)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text) - limit} more characters)"


def bounded(message: str, limit: int = MAX_MESSAGE) -> str:
    """`message` fit to repeat: each run of more than MAX_TOKEN non-blank characters (a value from a
    request or an object, quoted by whoever raised) cut to its first MAX_QUOTE, the whole to `limit`."""
    text = _LONG_TOKEN.sub(
        lambda m: f"{m.group(0)[:MAX_QUOTE]}... ({len(m.group(0)) - MAX_QUOTE} more characters)", message
    )
    if len(text) <= limit:
        return text
    tail = f"... ({len(text) - limit} more characters)"
    return text[: limit - len(tail)] + tail


def describe(exc: BaseException) -> str:
    """What went wrong, in words: a file error names its file and errno, anything else its type."""
    if isinstance(exc, PrepareError):
        return exc.message
    if isinstance(exc, OSError):
        where = f"{exc.filename}" if exc.filename is not None else ""
        if exc.filename2 is not None:
            where += f" -> {exc.filename2}"
        return f"{where}: {os_error_text(exc)}" if where else os_error_text(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def os_error_text(exc: OSError) -> str:
    """`No space left on device (ENOSPC)`: the errno in words and by name."""
    words = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    name = errno.errorcode.get(exc.errno) if exc.errno else None
    return f"{words} ({name})" if name else words


def filesystem_error(action: str, path: Path | str, exc: OSError) -> PrepareError:
    """A file operation that failed, naming the file (the one the error names, else `path`) and why."""
    where = describe(exc) if exc.filename is not None else f"{path}: {os_error_text(exc)}"
    return PrepareError(f"{action} {where}", reason="filesystem")
