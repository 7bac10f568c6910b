"""`make image` picks a runtime for the build's RUN steps that works on this host."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BUILD = Path("tools/build-image.sh")


def runtime(**env: str) -> str:
    done = subprocess.run(
        [str(BUILD), "--runtime"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def cgroup_v2_only() -> bool:
    """cgroup v2 mounted at /sys/fs/cgroup itself (not v1, not hybrid's tmpfs of v1 controllers)."""
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
def test_podman_builds_with_runc_where_crun_refuses_the_cgroups() -> None:
    expected = "default" if cgroup_v2_only() or shutil.which("runc") is None else "runc"
    assert runtime(IMAGE_BUILDER="podman") == expected
    assert runtime(IMAGE_BUILDER="podman", IMAGE_RUNTIME="crun") == "crun", "the variable wins"
