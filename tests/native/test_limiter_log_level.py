"""DRAGPU_LOG_LEVEL governs every line the limiter writes, the ones it writes while loading the driver included
(before it has read the rest of its configuration)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from limiter_env import limiter_env

pytestmark = pytest.mark.limiter

# A program that calls one of the limiter's NVML wrappers where no libnvidia-ml.so.1 can be found: the wrapper
# loads the driver, which fails with a warning, and the call answers NVML_ERROR_FUNCTION_NOT_FOUND (13).
CALL_NVML = (
    "import ctypes\n"
    "lib = ctypes.CDLL('libdragpu-limiter.so.1')\n"
    "print(lib.nvmlDeviceGetMemoryInfo(None, None))\n"
)
WARNING = "dragpu-limiter: warn: cannot load libnvidia-ml.so.1"


def call_nvml_without_driver(built: Path, tmp_path: Path, **settings: str) -> str:
    env = limiter_env(built, **settings)
    env["LD_LIBRARY_PATH"] = str(tmp_path)  # no driver there
    r = subprocess.run([sys.executable, "-c", CALL_NVML], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "13", r.stdout
    return r.stderr


@pytest.mark.parametrize("level", [None, "warn", "INFO", "debug", "loud"])
def test_a_failed_driver_load_warns_at_warn_level_and_above(
    built: Path, tmp_path: Path, level: str | None
) -> None:
    """Unset or malformed, the level is warn."""
    stderr = call_nvml_without_driver(built, tmp_path, **({"DRAGPU_LOG_LEVEL": level} if level else {}))
    assert WARNING in stderr


@pytest.mark.parametrize("level", ["error", "Error"])
def test_a_failed_driver_load_is_silent_at_error_level(built: Path, tmp_path: Path, level: str) -> None:
    stderr = call_nvml_without_driver(built, tmp_path, DRAGPU_LOG_LEVEL=level)
    assert WARNING not in stderr, stderr
