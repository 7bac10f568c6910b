"""The environment a process runs in under the limiter built for the tests, against the fake CUDA driver."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

_OURS = ("DRAGPU_", "FAKE_CUDA_", "LD_PRELOAD")


def limiter_env(built: Path, **settings: str) -> dict[str, str]:
    """This process's environment less any limiter or fake-driver settings the caller has, with the fake driver
    on the library path and the limiter build preloaded, then `settings` (DRAGPU_*, FAKE_CUDA_*, ...)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    env.update(LD_LIBRARY_PATH=str(built / "fake"), LD_PRELOAD=str(built / "libdragpu-limiter.so.1"))
    env.update(settings)
    return env


def require_c_toolchain() -> None:
    """Skips the test where the native limiter cannot be built: it needs a C compiler and make, nothing of CUDA
    (the library declares what it uses; the tests run it against the fake driver)."""
    for tool in (os.environ.get("CC", "cc"), "make"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} on PATH: the native limiter cannot be built (install a C toolchain)")
