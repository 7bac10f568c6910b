"""What the long-running commands (`kubelet-plugin`, `controller`) share as processes."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)


def wait_for_signal(stop: threading.Event | None = None) -> None:
    """Block until SIGTERM or SIGINT (the kubelet or the Deployment, and a developer's Ctrl-C)."""
    stop = stop or threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
