"""The native limiter (native/limiter), exercised from pytest so that the project's one test command covers it.

`make -C native/limiter test` runs the limiter's C test suite against the fake driver three times (a plain build,
an AddressSanitizer + UndefinedBehaviorSanitizer build and a ThreadSanitizer build); each of its cases is reported
here as its own test.
The other tests check, from the outside, the contract the kubelet plugin relies on: the environment variables
and `limiter-probe`'s output, plus NVML as Python programs see it (pynvml).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_driver import CONTEXT_BYTES, CONTEXT_CHARGE
from limiter_env import limiter_env, require_c_toolchain
from repo_paths import ROOT

LIMITER = ROOT / "native" / "limiter"
BUILD = LIMITER / "build"
FAKE_TOTAL = 80 * 2**30  # the fake driver's default memory per GPU
GiB = 2**30

pytestmark = [pytest.mark.limiter, pytest.mark.timeout(900)]

# The cases tests/run.sh reports for every build (a case it reports that is not here fails the suite).
CASES = [
    "exports",
    "entry points",
    "env-parsing+fuzz",
    "launch entry points",
    "t_linked (baseline)",
    "t_linked",
    "t_dlsym (baseline)",
    "t_dlsym",
    "t_getproc (baseline)",
    "t_getproc",
    "t_nvml (baseline)",
    "t_nvml global limit",
    "t_nvml limit by UUID",
    "t_nvml limit by ordinal",
    *(
        f"t_paths {sc}"
        for sc in (
            "stream-device",
            "pool-kept",
            "graph",
            "graph-legacy",
            "serving",
            "capture",
            "legacy-abi",
            "granularity",
            "import",
            "ipc",
            "ipc-same-claim",
            "import-same-claim",
            "export-churn",
            "import-self",
            "import-self-no-kcmp",
            "contexts",
            "contexts (tenant NVML)",
        )
    ),
    *(
        f"t_launch {sc}"
        for sc in (
            "other-device",
            "no-context",
            "long-kernels",
            "cold-burst",
            "predicted",
            "changed",
            "new-kinds",
            "quiet",
            "changed-short",
        )
    ),
    *(f"t_launch periodic {pct}%" for pct in (30, 70)),
    *(
        f"t_capture {sc}{variant}"
        for sc in ("global", "thread-local", "relaxed", "other-thread", "record")
        for variant in (" (baseline)", "")
    ),
    "t_ctx (baseline)",
    "t_ctx",
    "t_multiproc",
    "t_multiproc contexts",
    "t_fork",
    "t_threads",
    "t_failopen",
    "t_region lowered",
    "t_region impossible",
    "t_region deleted",
    "t_region resized",
    "t_region header",
    "t_region shared",
    "t_region clock",
    "t_region unlocked",
    "t_region replaced",
    "t_limits",
    "t_elastic",
    "compute unlimited",
    "compute 10%",
    "compute 30%",
    "compute 50%",
    "compute 70%",
    "compute 30%, 2 processes",
    "t_entrypoints busy 30%",
    "compute 30%, capture open",
    "compute without events, at most",
    "compute 30%, H100 timing",
    *(f"compute {pct}%, {us} us kernels, H100 timing" for us in (50, 5000) for pct in (10, 30, 50, 70)),
    *(f"compute {pct}%, 50 us kernels, H100 timing, a neighbour's context" for pct in (30, 50)),
    *(f"compute {pct}%, 2 us kernels, H100 timing" for pct in (10, 30, 50)),
]
BUILDS = ["build", "sanitize", "tsan"]
PLAIN_ONLY = {
    "t_launch changed-short",
    *(f"compute {pct}%, {us} us kernels, H100 timing" for us in (50, 5000) for pct in (10, 50, 70)),
    *(f"compute {pct}%, 2 us kernels, H100 timing" for pct in (10, 30, 50)),
}
"""Cases that measure a share on the same path as others, run in the plain build only (tests/run.sh says why)."""


@pytest.fixture(scope="session")
def suite(built: Path) -> dict[tuple[str, str], str]:
    """Runs `make test` once; maps (build, case) to "PASS ..." or the failure report."""
    result = subprocess.run(
        ["make", "-C", str(LIMITER), "test"], capture_output=True, text=True, check=False, timeout=850
    )
    outcomes: dict[tuple[str, str], str] = {}
    pending: list[tuple[str, str]] = []
    current: tuple[str, str] | None = None
    for line in result.stdout.splitlines():
        if m := re.match(r"(PASS|FAIL) (.+?)(?:\s{2,}(.*))?$", line):
            current = (m.group(2).strip(), line)
            pending.append(current)
        elif m := re.match(r"limiter tests \((\w+)\): ", line):
            outcomes.update({(m.group(1), name): text for name, text in pending})
            pending, current = [], None
        elif current is not None and line.startswith("    "):
            pending[-1] = (current[0], pending[-1][1] + "\n" + line)
    if not outcomes:
        pytest.fail(f"make -C native/limiter test produced no results:\n{result.stdout}\n{result.stderr}")
    return outcomes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("build", "case"),
    [(build, case) for case in CASES for build in BUILDS if build == "build" or case not in PLAIN_ONLY],
)
def test_native_suite_case(suite: dict[tuple[str, str], str], build: str, case: str) -> None:
    report = suite.get((build, case))
    assert report is not None, f"{case} did not run in the {build} build"
    assert report.startswith("PASS"), report


@pytest.mark.slow
def test_every_case_the_suite_reports_is_checked(suite: dict[tuple[str, str], str]) -> None:
    """A case added to tests/run.sh but not to CASES would fail without failing `make test`."""
    optional = {"t_cudart", "cuda_min.h = toolkit"}  # checked below, where the toolkit is installed
    unlisted = sorted({case for _, case in suite} - set(CASES) - optional)
    assert not unlisted, f"tests/run.sh reports cases CASES does not list: {unlisted}"


@pytest.mark.slow
@pytest.mark.parametrize("build", BUILDS)
def test_real_cuda_runtime_lookups_are_routed(suite: dict[tuple[str, str], str], build: str) -> None:
    report = suite.get((build, "t_cudart"))
    if report is None:
        pytest.skip("the CUDA toolkit's libcudart is not installed, so the real-runtime case was not built")
    assert report.startswith("PASS"), report


@pytest.mark.slow
@pytest.mark.parametrize("build", BUILDS)
def test_cuda_declarations_match_the_toolkit(suite: dict[tuple[str, str], str], build: str) -> None:
    report = suite.get((build, "cuda_min.h = toolkit"))
    if report is None:
        pytest.skip("the CUDA toolkit's headers are not installed, so there is nothing to compare against")
    assert report.startswith("PASS"), report


@pytest.mark.slow
def test_builds_without_the_cuda_toolkit(tmp_path: Path) -> None:
    """A machine without CUDA builds the library, the fakes, the probe and every test that needs no libcudart."""
    require_c_toolchain()
    empty = tmp_path / "no-cuda"
    empty.mkdir()
    build = tmp_path / "build"
    result = subprocess.run(
        [
            "make",
            "-C",
            str(LIMITER),
            "-j2",
            f"BUILD={build}",
            f"CUDA_INCLUDE={empty}",
            f"CUDA_LIB={empty}",
            "all",
            f"{build}/tests/t_linked",
            f"{build}/tests/t_getproc",
            f"{build}/bench/limiter-bench",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (build / "libdragpu-limiter.so.1").exists()
    assert str(empty) not in result.stdout, "a compile line still points at the CUDA include directory"
    # t_linked's figures assume contexts that hold nothing besides their limits' memory (as in run.sh).
    env = _env(build, tmp_path, DRAGPU_MEMORY_LIMIT="1Gi", FAKE_CUDA_CTX_BYTES="0")
    out = subprocess.run(
        [str(build / "tests" / "t_linked"), "limited"], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_claims_root_is_fixed_when_the_library_is_built(built: Path) -> None:
    """The library reads limits files where the CDI spec mounts them, a path no process can change; the tests'
    copy reads its own root instead."""
    result = subprocess.run(
        ["make", "-C", str(LIMITER), "build/testroot/libdragpu-limiter.so.1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    shipped = (built / "libdragpu-limiter.so.1").read_bytes()
    assert b"/run/dra-gpu/claims\0" in shipped
    test_copy = (built / "testroot" / "libdragpu-limiter.so.1").read_bytes()
    assert str(built / "claims").encode() + b"\0" in test_copy
    assert b"/run/dra-gpu/claims\0" not in test_copy


@pytest.mark.slow
def test_compute_cap_within_five_percent_of_target(suite: dict[tuple[str, str], str]) -> None:
    """Never more than 5 % above the share of wall time; never more than 5 % below it over the time the
    launcher had a CPU (on a loaded machine, time spent waiting for one is time nobody launched)."""
    for build in BUILDS:
        for target in (10, 30, 50, 70):
            report = suite[(build, f"compute {target}%")]
            m = re.search(r"busy\s+([\d.]+)%.*while running\s+([\d.]+)%", report)
            assert m, report
            assert float(m.group(1)) <= 1.05 * target, report
            assert float(m.group(2)) >= 0.95 * target, report


# ---- the contract with the kubelet plugin, checked from outside ----


def _env(built: Path, state_dir: Path | None = None, **settings: str) -> dict[str, str]:
    if state_dir is not None:
        settings["DRAGPU_LIMITER_STATE_DIR"] = str(state_dir)
    return limiter_env(built, **settings)


def _probe(built: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(built / "limiter-probe"), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_build_outputs_named_in_the_contract(built: Path) -> None:
    for name in ("libdragpu-limiter.so.1", "fake/libcuda.so.1", "fake/libnvidia-ml.so.1", "limiter-probe"):
        assert (built / name).exists(), f"make did not produce build/{name}"
    assert os.path.realpath(built / "libdragpu-limiter.so.1").endswith("libdragpu-limiter.so.1.0.0")


def test_probe_info_reports_the_claim_limit(built: Path, tmp_path: Path) -> None:
    """The claim's limit is the device's size; the process's own context is already spent from it."""
    result = _probe(built, _env(built, tmp_path, DRAGPU_MEMORY_LIMIT="1Gi"), "info")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"total={GiB} free={GiB - CONTEXT_CHARGE}", f"device_total={GiB}"]


def test_probe_alloc_reports_each_attempt_and_the_refusal(built: Path, tmp_path: Path) -> None:
    env = _env(built, tmp_path, DRAGPU_MEMORY_LIMIT=str(GiB + CONTEXT_CHARGE))  # 1 GiB besides the context
    result = _probe(built, env, "alloc", str(256 * 2**20), "6")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "alloc 0 ok",
        "alloc 1 ok",
        "alloc 2 ok",
        "alloc 3 ok",
        "alloc 4 CUDA_ERROR_OUT_OF_MEMORY",
        f"allocated={GiB} last=CUDA_ERROR_OUT_OF_MEMORY",
    ]


# A claim that leaves 1 GiB for allocations besides two processes' contexts.
SHARED_LIMIT = str(GiB + 2 * CONTEXT_CHARGE)


@pytest.fixture
def holder(built: Path, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    env = _env(built, tmp_path, DRAGPU_MEMORY_LIMIT=SHARED_LIMIT)
    proc = subprocess.Popen(
        [str(built / "limiter-probe"), "alloc", str(768 * 2**20), "1", "--hold"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline().strip() for _ in range(3)]
    assert lines == ["alloc 0 ok", f"allocated={768 * 2**20} last=CUDA_SUCCESS", "holding"], lines
    yield proc
    proc.kill()
    proc.wait()


def test_processes_of_a_claim_share_the_limit_and_a_killed_one_gives_memory_back(
    built: Path, tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    env = _env(built, tmp_path, DRAGPU_MEMORY_LIMIT=SHARED_LIMIT)
    total = int(SHARED_LIMIT)
    # Free: the limit less the holder's 768 MiB and both processes' contexts.
    assert _probe(built, env, "info").stdout.splitlines()[0] == f"total={total} free={256 * 2**20}"
    refused = _probe(built, env, "alloc", str(512 * 2**20), "1")
    assert refused.stdout.splitlines()[-1] == "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert _probe(built, env, "info").stdout.splitlines()[0] == f"total={total} free={GiB + CONTEXT_CHARGE}"
    assert (
        _probe(built, env, "alloc", str(GiB), "1").stdout.splitlines()[-1]
        == f"allocated={GiB} last=CUDA_SUCCESS"
    )


def test_malformed_limit_is_named_in_a_warning_and_ignored(built: Path, tmp_path: Path) -> None:
    result = _probe(built, _env(built, tmp_path, DRAGPU_MEMORY_LIMIT="10GB", DRAGPU_CORES_LIMIT="0"), "info")
    assert result.returncode == 0, result.stderr
    assert (
        'dragpu-limiter: warn: ignoring malformed DRAGPU_MEMORY_LIMIT="10GB" '
        "(expected bytes, optionally with a Ki, Mi, Gi or Ti suffix)" in result.stderr
    )
    assert (
        'ignoring malformed DRAGPU_CORES_LIMIT="0" (expected an integer percentage 1..100)' in result.stderr
    )
    # No limit: the driver's own figure, less what the process's context took on the device.
    assert result.stdout.splitlines()[0] == f"total={FAKE_TOTAL} free={FAKE_TOTAL - CONTEXT_BYTES}"


def test_fake_driver_memory_is_configurable(built: Path) -> None:
    env = _env(built, FAKE_CUDA_MEMORY_BYTES=str(4 * GiB))
    del env["LD_PRELOAD"]
    result = _probe(built, env, "info")
    free = 4 * GiB - CONTEXT_BYTES  # the probe's own context
    assert result.stdout.splitlines() == [f"total={4 * GiB} free={free}", f"device_total={4 * GiB}"]


def test_pynvml_sees_the_same_capped_view(built: Path, tmp_path: Path) -> None:
    script = (
        "import pynvml\n"
        "pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "m = pynvml.nvmlDeviceGetMemoryInfo(h)\n"
        "m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)\n"
        "print(m.total, m.free, m.used, m2.total, m2.free)\n"
    )
    env = _env(built, tmp_path, DRAGPU_MEMORY_LIMIT="3Gi")
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(3 * GiB), str(3 * GiB), "0", str(3 * GiB), str(3 * GiB)]
    assert result.stderr == ""


def _probe_info(built: Path, tmp_path: Path, env: dict[str, str]) -> dict[str, int]:
    state = tmp_path / "claim"
    state.mkdir(exist_ok=True)
    result = subprocess.run(
        [str(built / "limiter-probe"), "info"],
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(built / "fake"),
            "LD_PRELOAD": str(built / "libdragpu-limiter.so.1"),
            "DRAGPU_LIMITER_STATE_DIR": str(state),
            **env,
        },
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", result.stdout)}


@pytest.mark.limiter
def test_per_uuid_limits_follow_the_gpu_not_its_ordinal(built: Path, tmp_path: Path) -> None:
    """A container using only some of a claim's GPUs renumbers them: ordinal 0 may be a GPU the
    claim's ordinal limit was never meant for. The by-UUID list decides for every GPU it can name."""
    shared = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    whole = "GPU-11111111-2222-3333-4444-555555555555"
    limits = {"DRAGPU_MEMORY_LIMIT_0": str(2**30), "DRAGPU_MEMORY_LIMIT_BY_UUID": f"{shared}={2 * 2**30}"}
    # The fake driver, like the real one, exposes exactly the GPUs CUDA_VISIBLE_DEVICES names.
    only_whole = _probe_info(built, tmp_path, {"CUDA_VISIBLE_DEVICES": whole, **limits})
    assert only_whole["total"] == only_whole["device_total"] == 80 * 2**30  # not capped by ordinal 0
    only_shared = _probe_info(built, tmp_path, {"CUDA_VISIBLE_DEVICES": shared, **limits})
    assert only_shared["total"] == only_shared["device_total"] == 2 * 2**30
