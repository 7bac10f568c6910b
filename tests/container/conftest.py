"""Fixtures for the container tests: the native limiter, the local test image, and a kubelet plugin
whose CDI specs a real runtime (podman) reads. See ``container_node`` and ``container_support``."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from container_node import LIMITER_BUILD, Limiter, Node, plugin_node
from container_support import Podman, Volume, build_image, host_lock, podman_missing_reason


@pytest.fixture(scope="session")
def limiter_build() -> Limiter:
    """The native limiter's outputs, built when missing (``make test`` builds them first)."""
    wanted = Limiter.in_build()
    if not all(p.exists() for p in (wanted.library, wanted.fake_libcuda, wanted.probe)):
        proc = subprocess.run(
            ["make", "-C", str(LIMITER_BUILD.parent)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            pytest.fail(f"building the native limiter failed:\n{proc.stdout}\n{proc.stderr}")
    return wanted.resolved()


@pytest.fixture(scope="session")
def podman(request: pytest.FixtureRequest) -> Podman:
    """podman with the local test image, built from the host's busybox and libraries when missing."""
    reason = podman_missing_reason()
    if reason:
        pytest.skip(reason)
    request.getfixturevalue("exclusive_host")
    limiter_build: Limiter = request.getfixturevalue("limiter_build")
    return Podman(image=build_image(limiter_build.probe, limiter_build.library, limiter_build.fake_libcuda))


@pytest.fixture(scope="session")
def exclusive_host() -> Iterator[None]:
    with host_lock():
        yield


@pytest.fixture
def node(podman: Podman, limiter_build: Limiter) -> Iterator[Node]:
    """A kubelet plugin of the test's own, writing its specs where podman reads them; claims the test
    left prepared are unprepared (and any spec file removed) after it."""
    with plugin_node(limiter_build, podman.cdi_dir) as node:
        yield node
        node.unprepare_all()


@pytest.fixture
def driver_stand_in(limiter_build: Limiter) -> list[Volume]:
    return limiter_build.driver_stand_in()
