"""A local TCP port that nothing listens on: for a server a test starts, or for a connection that must be refused."""

from __future__ import annotations

import socket


def unused_port() -> int:
    """A port the kernel just handed out and released (another process could take it meanwhile; tests use it
    at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port
