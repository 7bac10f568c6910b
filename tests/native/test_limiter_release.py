"""The limiter library says which release of dra-gpu it belongs to: the same version as the agent's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from limiter_env import limiter_env

from dra_gpu import __version__


def test_the_library_carries_and_logs_the_release(built: Path) -> None:
    banner = f"dragpu-limiter release {__version__}"
    # A node's admin can tell which release a file is without running it.
    assert banner.encode() in (built / "libdragpu-limiter.so.1").read_bytes()
    probe = subprocess.run(
        [str(built / "limiter-probe"), "info"],
        env=limiter_env(built, DRAGPU_LOG_LEVEL="debug"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert probe.returncode == 0, probe.stderr
    assert f"dragpu-limiter: debug: {banner} initialised: " in probe.stderr
