"""Fixtures shared by the test modules: plugin directories, the fake API server, the kubelet, the
built limiter, and the root logger that commands' `main()` reconfigures."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from limiter_env import require_c_toolchain
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
    """The native limiter's build directory, built once (skipped only without a C toolchain)."""
    require_c_toolchain()
    result = subprocess.run(["make", "-C", str(LIMITER), "-j2"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"make -C native/limiter failed:\n{result.stdout}\n{result.stderr}"
    return LIMITER / "build"
