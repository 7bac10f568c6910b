"""`make gpu-check` / `python3 -m gpucheck` as a user runs them here: no GPU, with and without nvcc.

The last test drives the whole check (detection through the JSON report) against the native
limiter's fake CUDA driver and fake NVML, running the driver-API check program for real.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_driver import usable
from repo_paths import ROOT

sys.path.insert(0, str(ROOT))

from gpucheck.build import build_programs

FAKE = ROOT / "native/limiter/build/fake"
NO_GPU_LINE = "gpu-check: no NVIDIA GPU found ("


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_CHECK_", "DRAGPU_"))}
    env.pop("LD_LIBRARY_PATH", None)
    env.update(extra)
    return env


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidiactl").exists()


pytestmark = pytest.mark.skipif(
    _has_gpu(), reason="this machine has an NVIDIA GPU: `make gpu-check` runs the real suite there"
)


def _run(argv: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA programs cannot be built"
)
def test_without_a_gpu_it_builds_the_cuda_programs_then_exits_77(tmp_path: Path) -> None:
    done = _run(["python3", "-m", "gpucheck"], _environment(GPU_CHECK_OUT=str(tmp_path / "out")))
    assert done.returncode == 77, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpu-check: built 3 CUDA programs with"), done.stdout
    assert lines[-1].startswith(NO_GPU_LINE) and lines[-1].endswith("): nothing to check here")
    assert len(lines) == 2
    for name in ("gc_drv", "gc_rt_shared", "gc_rt_static"):
        assert (ROOT / "build/gpu-check/bin" / name).is_file()
    assert not (tmp_path / "out").exists(), "no report without a GPU"


def test_without_nvcc_it_says_so_and_still_exits_77() -> None:
    done = _run([sys.executable, "-m", "gpucheck"], _environment(PATH="/usr/bin:/bin", NVCC=""), timeout=120)
    assert done.returncode == 77, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "gpu-check: nvcc not found: the CUDA programs were not built (checks that need them are skipped)",
        done.stdout.splitlines()[-1],
    ]
    assert done.stdout.splitlines()[-1].startswith(NO_GPU_LINE)


def test_the_test_flow_accepts_77() -> None:
    done = _run(["make", "-s", "gpu-check-smoke"], _environment(PATH="/usr/bin:/bin"), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu-check: nvcc not found, the CUDA programs are not built" in done.stdout
    assert NO_GPU_LINE in done.stdout


def test_an_unknown_check_name_is_a_usage_error() -> None:
    done = _run([sys.executable, "-m", "gpucheck", "--only", "limiter.capp"], _environment(), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu-check: no check named 'limiter.capp'; --list shows them"


@pytest.mark.slow
@pytest.mark.limiter
@pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA programs cannot be built"
)
@pytest.mark.usefixtures("built")  # builds the limiter and its fake driver; fails if they do not build
def test_the_whole_check_against_the_fake_driver_writes_a_report(tmp_path: Path) -> None:
    assert importlib.util.find_spec("pynvml"), "the fake GPU is found through NVML: install nvidia-ml-py"
    out = tmp_path / "out"
    env = _environment(LD_LIBRARY_PATH=str(FAKE), GPU_CHECK_OUT=str(out), GPU_CHECK_QUICK="1")
    only = ["--only", "limiter.cap", "--only", "limiter.pooled", "--only", "limiter.view.nvml"]
    only += ["--only", "limiter.shared"]
    done = _run([sys.executable, "-m", "gpucheck", *only], env)
    data = json.loads((out / "report.json").read_text())
    results = {r["name"]: r for r in data["results"]}
    assert results["limiter.cap.driver-api"]["status"] == "pass", done.stdout
    assert results["limiter.cap.driver-api"]["figures"]["reported_total"] == 3000 * 2**20
    assert results["limiter.pooled"]["status"] == "pass", done.stdout
    assert results["limiter.view.nvml"]["status"] == "pass", done.stdout
    for kind in ("ipc", "vmm"):  # this machine allows kcmp: both are charged once
        assert results[f"limiter.shared.{kind}"]["status"] == "pass", done.stdout
    # The fake cannot take the CUDA runtime past its initialisation: those fail, and say why.
    assert results["limiter.cap.runtime-shared"]["status"] == "fail"
    assert "cannot set up CUDA device 0" in results["limiter.cap.runtime-shared"]["summary"]
    assert data["gpu"]["uuid"] == "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000"
    assert done.returncode == data["exit_status"] == 1
    assert "FAIL  limiter.cap.runtime-shared" in done.stdout
    assert done.stdout.rstrip().endswith(f"report: {out / 'report.json'}")


@pytest.mark.slow
@pytest.mark.limiter
@pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA programs cannot be built"
)
@pytest.mark.usefixtures("built")  # builds the limiter and its fake driver; fails if they do not build
def test_the_node_path_prepares_runs_under_the_claims_cdi_environment_and_unprepares() -> None:
    """The node-path program with a simulated inventory: the fake driver takes the claim's GPU UUID."""
    built = build_programs(ROOT / "build/gpu-check")
    assert "gc_drv" in built.programs, built.errors
    cap = 3000 * 2**20
    env = _environment(LD_LIBRARY_PATH=str(FAKE), PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}")
    argv = [sys.executable, "-m", "gpucheck.nodepath", str(built.programs["gc_drv"])]
    argv += [str(FAKE.parent / "libdragpu-limiter.so.1"), str(cap), "30", "simulated:1xH100-80GB"]
    done = _run(argv, env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == "pass", result
    figures = result["figures"]
    assert figures["reported_total"] == cap
    assert figures["allocated"] == usable(cap)  # the cap holds the program's CUDA context too
    assert figures["environment"]["DRAGPU_CORES_LIMIT"] == "30"
    assert figures["environment"]["LD_PRELOAD"].endswith("libdragpu-limiter.so.1.0.0"), (
        "the mounted host file"
    )
    assert figures["cdi_specs_left"] == [] and figures["claim_dirs_left"] == []


def test_a_cuda_program_that_does_not_build_fails_the_run_even_without_a_gpu(tmp_path: Path) -> None:
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\necho \"nvcc fatal   : Unsupported gpu architecture 'compute_80'\" >&2\nexit 1\n"
    )
    nvcc.chmod(0o755)
    env = _environment(NVCC=str(nvcc), GPU_CHECK_BUILD=str(tmp_path / "build"), PATH="/usr/bin:/bin")
    done = _run([sys.executable, "-m", "gpucheck"], env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "gpu-check: gc_rt_shared: build failed: exit 1: nvcc fatal   : Unsupported gpu architecture 'compute_80'"
        in done.stdout
    )
    assert done.stdout.splitlines()[-1].startswith(NO_GPU_LINE)
