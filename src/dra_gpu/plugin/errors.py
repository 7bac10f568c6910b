"""The per-claim failure: its message goes verbatim into the pod's events through the kubelet."""

from __future__ import annotations


class PrepareError(Exception):
    """A claim cannot be prepared or unprepared; ``reason`` is the short label used in metrics."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason

    def __str__(self) -> str:
        return self.message
