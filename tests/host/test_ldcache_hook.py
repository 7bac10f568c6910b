"""The `update-ldcache` hook as the container runtime runs it: the installed file, executed by the host's
python3 with the OCI state on stdin, against a bundle and a container root on disk. It parses its input
as JSON, builds the real loader cache with the real ldconfig, and makes the `libcuda.so` link only inside
the container's root, however the container's own links point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dra_gpu.host.driver_root import host_python, install_ldcache_hook

PYTHON = host_python(Path("/"))
LIBS = "usr/lib/x86_64-linux-gnu"

pytestmark = [
    pytest.mark.skipif(PYTHON is None, reason="this machine has no /usr/bin/python3 to run the hook with"),
    pytest.mark.skipif(shutil.which("ldconfig") is None, reason="this machine has no ldconfig"),
    pytest.mark.skipif(os.geteuid() != 0, reason="ldconfig -r chroots into the container's root: root only"),
]


def bundle(tmp_path: Path) -> tuple[Path, Path]:
    """A bundle whose config.json names its rootfs (relative, as runc's bundles do), and the rootfs with a
    driver library folder: libcuda.so.1 -> libcuda.so.550.1 as the driver installs it."""
    root = tmp_path / "bundle" / "rootfs"
    libs = root / LIBS
    libs.mkdir(parents=True)
    (root / "etc").mkdir()
    (libs / "libcuda.so.550.1").write_bytes(b"")
    (libs / "libcuda.so.1").symlink_to("libcuda.so.550.1")
    config = {
        "ociVersion": "1.2.0",
        "root": {"path": "rootfs", "readonly": False},
        "process": {"args": ["sh"]},
    }
    (tmp_path / "bundle" / "config.json").write_text(json.dumps(config, indent=2))
    return tmp_path / "bundle", root


def run_hook(tmp_path: Path, state: str, *folders: str) -> subprocess.CompletedProcess[str]:
    hook = install_ldcache_hook(tmp_path / "hooks", PYTHON)
    return subprocess.run(
        [str(hook), *folders], input=state, capture_output=True, text=True, timeout=60, env={}, check=False
    )


def state_of(bundle_dir: Path) -> str:
    return json.dumps(
        {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 1, "bundle": str(bundle_dir)}
    )


def test_the_hook_builds_the_cache_and_the_dev_link(tmp_path: Path) -> None:
    bundle_dir, root = bundle(tmp_path)
    done = run_hook(tmp_path, state_of(bundle_dir), f"/{LIBS}")
    assert done.returncode == 0, done.stderr
    assert os.readlink(root / LIBS / "libcuda.so") == "libcuda.so.1"
    assert (root / "etc" / "ld.so.cache").is_file()
    assert run_hook(tmp_path, state_of(bundle_dir), f"/{LIBS}").returncode == 0  # again: nothing to do


def test_a_link_in_the_container_never_leads_the_new_link_out_of_its_root(tmp_path: Path) -> None:
    bundle_dir, root = bundle(tmp_path)
    outside = tmp_path / "host-dir"  # a host directory with a libcuda.so.1, as a tenant would aim at
    outside.mkdir()
    (outside / "libcuda.so.1").write_bytes(b"")
    (root / "usr" / "lib" / "evil").symlink_to(outside)  # absolute: resolved inside the root
    (root / "usr" / "lib" / "up").symlink_to("../../../../host-dir")  # .. stops at the root
    done = run_hook(tmp_path, state_of(bundle_dir), "/usr/lib/evil", "/usr/lib/up", "/../../host-dir")
    assert done.returncode == 0, done.stderr
    assert not (outside / "libcuda.so").exists() and not (outside / "libcuda.so").is_symlink()
    # a link that stays inside the root is followed there
    (root / "usr" / "lib64").symlink_to(f"/{LIBS}")
    assert run_hook(tmp_path, state_of(bundle_dir), "/usr/lib64").returncode == 0
    assert os.readlink(root / LIBS / "libcuda.so") == "libcuda.so.1"


@pytest.mark.parametrize(
    ("state", "folders", "message"),
    [
        ('{"bundle": "/x"', ["/usr/lib"], "the OCI state on stdin is not JSON"),
        ('{"id": "c1"}', ["/usr/lib"], "the OCI state on stdin names no absolute bundle directory"),
        ("{}", [], "name at least one folder inside the container"),
        ("{}", ["usr/lib"], "usr/lib is not an absolute path inside the container"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    tmp_path: Path, state: str, folders: list[str], message: str
) -> None:
    done = run_hook(tmp_path, state, *folders)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"dra-gpu update-ldcache: {message}")


def test_a_config_without_a_root_is_refused(tmp_path: Path) -> None:
    bundle_dir, _ = bundle(tmp_path)
    (bundle_dir / "config.json").write_text(json.dumps({"ociVersion": "1.2.0"}))
    done = run_hook(tmp_path, state_of(bundle_dir), f"/{LIBS}")
    assert (done.returncode, done.stderr) == (
        2,
        f"dra-gpu update-ldcache: no root.path in {bundle_dir}/config.json\n",
    )


def test_the_python_hook_is_installed_where_the_host_has_python_and_the_script_elsewhere(
    tmp_path: Path,
) -> None:
    assert (
        install_ldcache_hook(tmp_path / "a", "/usr/bin/python3")
        .read_text()
        .startswith("#!/usr/bin/python3 -I\n")
    )
    assert install_ldcache_hook(tmp_path / "b", None).read_text().startswith("#!/bin/sh\n")
    assert (
        host_python(Path("/driver-root"), Path("/run/nvidia/driver")) is None
    )  # a driver container's python
