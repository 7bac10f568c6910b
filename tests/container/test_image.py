"""The install image: built from the Dockerfile with the builder `make image` uses, then run.

A broken Dockerfile (a missing file, a build step that fails, an entry point that does not start)
fails here. Where no registry is reachable, the Debian base images are produced locally first
(`tools/base-images.sh`, from the apt mirror); the build itself downloads Debian and Python packages.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest
from container_support import REPO_ROOT, RUN_FLAGS, RUNTIME

from dra_gpu import __version__

BUILD = REPO_ROOT / "tools" / "build-image.sh"
BASES = REPO_ROOT / "tools" / "base-images.sh"
NO_BUILDER = 3

pytestmark = [pytest.mark.container, pytest.mark.slow]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _builder() -> str:
    proc = _run([str(BUILD), "--builder"], 30)
    if proc.returncode == NO_BUILDER:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _ensure_base_images(builder: str) -> str | None:
    """Produce the base images where they are missing; why they could not be, or None."""
    names = _run([str(BASES), "--print"], 30).stdout.split()
    assert names, "tools/base-images.sh found no base images in the Dockerfile"
    if builder != "podman":
        return None  # docker and buildah pull them (tools/base-images.sh imports into podman's store)
    missing = [n for n in names if _run(["podman", "image", "exists", n], 30).returncode != 0]
    if not missing:
        return None
    if shutil.which("mmdebstrap") is None or os.geteuid() != 0:
        return f"the base images {', '.join(missing)} are missing and only root with mmdebstrap makes them"
    proc = _run([str(BASES)], 900)
    assert proc.returncode == 0, f"tools/base-images.sh failed:\n{proc.stderr}"
    return None


def _run_argv(builder: str, image: str, *args: str, entrypoint: str | None = None) -> list[str]:
    flags = ["--entrypoint", entrypoint] if entrypoint else []
    if builder == "podman":
        return ["podman", "--runtime", RUNTIME, "run", "--rm", *RUN_FLAGS, *flags, image, *args]
    return [builder, "run", "--rm", "--network", "none", *flags, image, *args]


@pytest.fixture(scope="module")
def image() -> tuple[str, str]:
    builder = _builder()
    if builder == "buildah":
        pytest.skip("buildah builds but cannot run the image; install podman or docker to run it")
    no_bases = _ensure_base_images(builder)
    # One tag per checkout, so two checkouts do not collide. Built without the cache: a step that
    # works only from a cached layer (a runtime that cannot run RUN steps here) must fail here.
    tag = f"localhost/dra-gpu-test:image-{hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:12]}"
    proc = _run([str(BUILD), "--tag", tag, "--", "--no-cache"], 1500)
    if proc.returncode != 0 and no_bases:
        pytest.skip(f"{no_bases}, and the build could not pull them")
    assert proc.returncode == 0, f"the image build failed:\n{proc.stderr[-6000:]}"
    assert proc.stdout.strip() == tag
    return builder, tag


@pytest.mark.timeout(1800)
def test_the_image_runs_the_command(image: tuple[str, str]) -> None:
    builder, tag = image
    proc = _run(_run_argv(builder, tag, "--version"), 120)
    assert (proc.returncode, proc.stdout) == (0, f"dra-gpu {__version__}\n"), proc.stderr


@pytest.mark.timeout(1800)
def test_the_image_lists_simulated_gpus(image: tuple[str, str]) -> None:
    builder, tag = image
    proc = _run(_run_argv(builder, tag, "gpus", "--simulate", "1xH100-80GB"), 120)
    assert proc.returncode == 0, proc.stderr
    assert "NVIDIA H100 80GB HBM3" in proc.stdout
    assert "1 GPU(s), backend simulated" in proc.stdout


@pytest.mark.timeout(1800)
def test_the_image_carries_the_limiter_the_init_container_copies(image: tuple[str, str]) -> None:
    """The library at the path the DaemonSet's init container copies from, linking only the C library."""
    from dra_gpu.manifests import load_values, render
    from dra_gpu.manifests.render import IMAGE_LIMITER

    builder, tag = image
    assert IMAGE_LIMITER in render(load_values())["kubelet-plugin.yaml"]
    script = (
        f"test -f {IMAGE_LIMITER} && python3 -c \"import ctypes; ctypes.CDLL('{IMAGE_LIMITER}')\" && echo ok"
    )
    proc = _run(_run_argv(builder, tag, "-c", script, entrypoint="sh"), 120)
    assert (proc.returncode, proc.stdout) == (0, "ok\n"), proc.stderr
