"""What the long-running commands (`kubelet-plugin`, `controller`) share as processes."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[threading.Event]:
    """Set `stop` on SIGTERM or SIGINT while inside; entered before a slow start, a signal that
    arrives during the start still stops the process cleanly."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait_for_signal(stop: threading.Event | None = None) -> None:
    """Block until SIGTERM or SIGINT (the kubelet or the Deployment, and a developer's Ctrl-C)."""
    with stop_on_signals(stop or threading.Event()) as event:
        while not event.wait(1.0):
            pass
