"""Fixtures shared by the test modules: plugin directories, the fake API server, the kubelet, the
built limiter, and the root logger that commands' `main()` reconfigures."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_harness import Kubelet, PluginDirs

from dra_gpu.kube.fake import FakeKube

LIMITER = Path(__file__).resolve().parents[1] / "native" / "limiter"


@pytest.fixture
def dirs() -> Iterator[PluginDirs]:
    d = PluginDirs.create()
    yield d
    d.cleanup()


@pytest.fixture
def api() -> FakeKube:
    return FakeKube()


@pytest.fixture
def kubelet(dirs: PluginDirs) -> Iterator[Kubelet]:
    k = Kubelet(dirs.registration_dir)
    yield k
    k.close()


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """`main()` and `setup_logging()` configure the root logger for the process; put it back."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.fixture(scope="session")
def built() -> Path:
    """The native limiter's build directory, built once; skipped where it cannot be built."""
    if shutil.which(os.environ.get("CC", "cc")) is None or shutil.which("make") is None:
        pytest.skip("no C compiler or make: the native limiter cannot be built")
    if not Path("/usr/local/cuda/include/cuda.h").exists() and "CUDA_INCLUDE" not in os.environ:
        pytest.skip("the CUDA headers the limiter builds against are not installed (CUDA_INCLUDE)")
    result = subprocess.run(["make", "-C", str(LIMITER), "-j2"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return LIMITER / "build"
