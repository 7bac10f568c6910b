"""`dra-gpu kubelet-plugin` as a process: flags and their environment variables, start, SIGTERM."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from plugin_harness import CLI, Kubelet, PluginDirs, env_for, unreachable_kubeconfig
from waiting import wait_for

from dra_gpu.manifests import load_values, render
from dra_gpu.plugin import DEFAULT_LIMITER_LIBRARY


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60)


def test_help_run_as_a_process_names_the_main_flags_with_their_variables() -> None:
    # Every flag and its variable, for every command: tests/flags/test_flags.py.
    text = run_cli("--help").stdout
    for flag in (
        "--node-name",
        "--driver-name",
        "--registration-dir",
        "--plugins-dir",
        "--cdi-dir",
        "--state-dir",
        "--gpu-backend",
        "--limiter-library",
        "--sharing",
        "--kubeconfig",
        "--http-address",
        "--publish-slices",
        "--watchdog-context-allowance",
        "--watchdog-grace-period",
    ):
        assert flag in text
        assert "DRA_GPU_" + flag[2:].upper().replace("-", "_") in text.replace("\n", " ").replace("  ", " ")


def test_bad_flags_are_named(dirs: PluginDirs, tmp_path: Path) -> None:
    env = env_for(dirs, unreachable_kubeconfig(tmp_path / "kubeconfig"))
    del env["DRA_GPU_NODE_NAME"]
    missing = run_cli(env=env)
    assert missing.returncode == 2 and "--node-name (or DRA_GPU_NODE_NAME) is required" in missing.stderr
    bad_sharing = run_cli("--node-name", "n", "--sharing", "0=Fast", env=env)
    assert bad_sharing.returncode == 2 and "unknown mode 'Fast'" in bad_sharing.stderr
    bad_backend = run_cli("--node-name", "n", "--gpu-backend", "fake", env=env)
    assert bad_backend.returncode == 2 and "unknown inventory 'fake'" in bad_backend.stderr
    bad_shm = run_cli("--node-name", "n", "--mps-shm-size", "lots", env=env)
    assert bad_shm.returncode == 2
    assert "--mps-shm-size 'lots' must be a quantity of at least 64Mi (e.g. 1Gi)" in bad_shm.stderr
    bad_allowance = run_cli("--node-name", "n", "--watchdog-context-allowance=-1Gi", env=env)
    assert bad_allowance.returncode == 2
    assert (
        "--watchdog-context-allowance '-1Gi' must be a quantity of 0 or more (e.g. 2Gi)"
        in bad_allowance.stderr
    )
    bad_grace = run_cli("--node-name", "n", "--watchdog-grace-period=-5", env=env)
    assert bad_grace.returncode == 2
    assert "--watchdog-grace-period must be 0 or a positive number of seconds" in bad_grace.stderr
    bad_grace_env = run_cli("--node-name", "n", env={**env, "DRA_GPU_WATCHDOG_GRACE_PERIOD": "soon"})
    assert bad_grace_env.returncode == 2
    assert "DRA_GPU_WATCHDOG_GRACE_PERIOD='soon' is invalid: expected a number" in bad_grace_env.stderr
    no_root = run_cli("--node-name", "n", "--driver-root", str(tmp_path / "nowhere"), env=env)
    assert (
        no_root.returncode == 2
        and f"--driver-root {tmp_path / 'nowhere'} is not a directory" in no_root.stderr
    )


def test_runs_registers_answers_and_leaves_on_sigterm(dirs: PluginDirs, tmp_path: Path) -> None:
    env = env_for(dirs, unreachable_kubeconfig(tmp_path / "kubeconfig"))
    process = subprocess.Popen(CLI, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        kubelet = Kubelet(dirs.registration_dir, timeout_s=30)
        info = kubelet.register(wait_s=30)
        assert info.endpoint == str(dirs.service_socket)
        answer = kubelet.prepare(("default", "c", "3b1f7c7e-0000-4000-8000-000000000001"))
        error = answer["3b1f7c7e-0000-4000-8000-000000000001"].error
        assert error.startswith("reading ResourceClaim default/c: the API server could not be reached: ")
        kubelet.close()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "nvidia-smi and nvidia-cuda-mps-control are not run" in stderr
    assert '"msg": "stopping", "signal": "SIGTERM"' in stderr
    wait_for(
        lambda: not dirs.registration_socket.exists() and not dirs.service_socket.exists(),
        what="the plugin's sockets removed",
    )


def test_the_default_limiter_library_is_the_one_the_daemonset_installs() -> None:
    # Both follow the release's version, so a plugin run without DRA_GPU_LIMITER_LIBRARY still finds it.
    daemonset = render(load_values(None))["kubelet-plugin.yaml"]
    assert f"value: {DEFAULT_LIMITER_LIBRARY}\n" in daemonset
