"""The GPU check's elastic-compute and colocation results: how each is judged from given figures, how the
claims' files are laid out for the library, and that the library takes a claim so laid out into arbitration
(against the fake driver, where this tree's library does elastic compute)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import ROOT

sys.path.insert(0, str(ROOT))

from dra_gpu.limiter_abi import board as project_board
from dra_gpu.limiter_abi import region as project_region
from gpucheck import claims, report
from gpucheck.build import build_programs
from gpucheck.checks import colocation, elastic
from gpucheck.checks.colocation import Outcome
from gpucheck.checks.elastic import Run
from gpucheck.claims import Claim, Layout
from gpucheck.context import Context
from gpucheck.driver import selects
from gpucheck.gpu import Gpu
from gpucheck.proc import Ran
from gpucheck.timeline import attribute, percentile, reclaim_ns, starts_after_gaps, window

LIMITER = ROOT / "native/limiter"
UUID = "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000"
"""The fake driver's device 0."""
MS = 1_000_000
OK = Ran(["gc_rt"], 0, "launches=1", "", 1.0)


# -- who held the GPU ------------------------------------------------------------------------------------------
def test_a_span_preempted_by_another_claims_kernel_holds_the_gpu_only_around_it() -> None:
    # a's 5 ms kernel was preempted by b's from 2 to 4 ms: its span stays open, and b ran in the middle.
    bins = attribute({"a": [(0, 5 * MS)], "b": [(2 * MS, 4 * MS)]}, 0, 5 * MS, 5 * MS)
    assert bins == {"a": [3 * MS], "b": [2 * MS]}


def test_attribution_splits_time_into_bins_and_leaves_idle_time_to_no_one() -> None:
    bins = attribute({"a": [(0, 3 * MS)], "b": [(5 * MS, 6 * MS), (5 * MS, 7 * MS)]}, 1 * MS, 9 * MS, 2 * MS)
    assert bins == {"a": [2 * MS, 0, 0, 0], "b": [0, 0, 2 * MS, 0]}


def test_attribution_gives_each_instant_to_the_latest_started_span_covering_it() -> None:
    rng = random.Random(31)
    for _ in range(200):
        spans: dict[str, list[tuple[int, int]]] = {c: [] for c in "abc"}
        for start in rng.sample(range(90), rng.randrange(1, 12)):  # two contexts never start at one instant
            spans[rng.choice("abc")].append((start, start + rng.randrange(1, 30)))
        lo, hi, bin_ns = rng.randrange(0, 20), rng.randrange(60, 120), rng.randrange(1, 25)
        expected = {c: [0] * -(-(hi - lo) // bin_ns) for c in spans}
        for t in range(lo, hi):  # one nanosecond at a time
            covering = [(s, c) for c, ss in spans.items() for s, e in ss if s <= t < e]
            if covering:
                expected[max(covering)[1]][(t - lo) // bin_ns] += 1
        assert attribute(spans, lo, hi, bin_ns) == expected, (spans, lo, hi, bin_ns)


def test_the_window_is_where_every_claim_ran_less_the_trim() -> None:
    assert window({"a": [(0, 10 * MS)], "b": [(2 * MS, 12 * MS)]}, 1 * MS) == (3 * MS, 9 * MS)
    assert window({"a": [(0, 10 * MS)], "b": []}, 0) == (0, 0)


def test_bursts_start_after_gaps() -> None:
    spans = [(0, 1), (2, 3), (100, 101), (102, 103), (300, 301)]
    assert starts_after_gaps(spans, 50) == [0, 100, 300]


def test_reclaim_is_when_the_borrower_is_first_held_to_its_floor() -> None:
    # 1 ms bins: the borrower holds the whole GPU, then from 6 ms after the wake 40 %.
    borrower = [MS] * 16 + [MS * 4 // 10] * 30
    assert reclaim_ns(borrower, 0, MS, 10 * MS, 46 * MS, 5 * MS, 45) == 6 * MS
    assert reclaim_ns([MS] * 46, 0, MS, 10 * MS, 46 * MS, 5 * MS, 45) is None


def test_percentiles_are_values_that_occurred() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == 99.0 and percentile(values, 50) == 50.0 and percentile([7.0], 95) == 7.0


# -- judging the elastic results -------------------------------------------------------------------------------
def _spans(share: float, offset: int = 0, seconds: int = 2) -> list[tuple[int, int]]:
    """A claim holding the GPU `share` of each millisecond, at `offset` ns into it."""
    length = int(share * MS)
    return [(p * MS + offset, p * MS + offset + length) for p in range(seconds * 1000)]


def test_floors_pass_when_each_claim_gets_its_floor_less_a_point() -> None:
    pair = elastic.FLOOR_SETS[2]  # a: 30-100 %, b: 50 %
    run = Run(spans={"a": _spans(0.495), "b": _spans(0.495, 500_000)}, ran=[OK, OK])
    result = elastic.judge_floors("compute.elastic.floors.short.2-claims", pair, run)
    assert result.status == report.PASS, result.summary
    assert result.figures["held_percent"] == {"a": 49.5, "b": 49.5}
    assert result.summary.startswith(
        "goal each >= its floor - 1 point: a 49.5 % (30-100 %), b 49.5 % (50 %);"
    )
    assert result.figures["goal"] == "each claim >= its floor - 1 point"


def test_floors_fail_naming_the_claim_below_its_floor() -> None:
    pair = elastic.FLOOR_SETS[2]
    run = Run(spans={"a": _spans(0.52), "b": _spans(0.48, 520_000)}, ran=[OK, OK])
    result = elastic.judge_floors("compute.elastic.floors.short.2-claims", pair, run)
    assert result.status == report.FAIL
    assert result.summary.endswith("; below: b")
    assert result.figures["held_percent"]["b"] == 48.0


def test_a_claim_the_library_did_not_take_into_arbitration_fails_quoting_it() -> None:
    line = (
        "dragpu-limiter: warn: elastic compute on GPU-x: /run/dra-gpu/gpus/GPU-x/board: it is missing; "
        "claim gpu-check/a runs its fixed floor of 30%"
    )
    run = Run(spans={"a": _spans(0.5), "b": _spans(0.5, 500_000)}, ran=[OK, OK], library=[f"a: {line}"])
    result = elastic.judge_floors("compute.elastic.floors.short.2-claims", elastic.FLOOR_SETS[2], run)
    assert result.status == report.FAIL
    assert result.summary == f"no measurement: the library did not take the claim into arbitration: a: {line}"


def test_a_claim_whose_program_could_not_run_fails_with_its_error() -> None:
    run = Run(
        spans={"a": _spans(0.5), "b": []}, ran=[OK, OK], printed={"b": {"error": "cudaErrorMemoryAllocation"}}
    )
    result = elastic.judge_floors("compute.elastic.floors.short.2-claims", elastic.FLOOR_SETS[2], run)
    assert result.summary == "no measurement: b: gc_rt: cudaErrorMemoryAllocation"


def test_alone_long_kernels_must_keep_the_gpu_95_percent_busy() -> None:
    for share, status in ((0.96, report.PASS), (0.93, report.FAIL)):
        run = Run(spans={"alone": _spans(share)}, ran=[OK])
        result = elastic.judge_alone("compute.elastic.alone.long", run, None)
        assert result.status == status, result.summary
        assert "(goal >= 95 %)" in result.summary


def test_alone_short_kernels_are_judged_against_the_same_kernels_without_the_limiter() -> None:
    run = Run(spans={"alone": _spans(0.92)}, ran=[OK])
    result = elastic.judge_alone("compute.elastic.alone.short", run, 0.945)
    assert result.status == report.PASS, result.summary  # 92 >= 0.95 x 94.5
    assert result.figures["goal_percent"] == pytest.approx(89.775)
    assert "(goal >= 95 % of 94.5 % unthrottled = 89.8 %)" in result.summary
    assert elastic.judge_alone("x", Run(spans={"alone": _spans(0.89)}, ran=[OK]), 0.945).status == report.FAIL


def _reclaim_run(back_after_ms: int, wakes: int = 8) -> Run:
    """The borrower alone at 100 %, the waker in bursts of 200 ms every 500 ms; `back_after_ms` after each
    wake the borrower holds 40 %, the waker 60 %."""
    borrower, waker = [], []
    for p in range(wakes * 500 + 500):
        t = p * MS
        phase = p % 500
        waking = phase >= 300
        if not waking:
            borrower.append((t, t + MS))
        elif phase - 300 < back_after_ms:  # the waker's first kernels queue behind the borrower's
            borrower.append((t, t + 9 * MS // 10))
            waker.append((t + 9 * MS // 10, t + MS))
        else:
            borrower.append((t, t + 4 * MS // 10))
            waker.append((t + 4 * MS // 10, t + MS))
    return Run(spans={"borrower": borrower, "waker": waker}, ran=[OK, OK])


def test_reclaim_p95_within_100_ms_passes_and_says_whether_the_stretch_goal_was_met() -> None:
    result = elastic.judge_reclaim("compute.elastic.reclaim", _reclaim_run(8))
    assert result.status == report.PASS, result.summary
    assert result.figures["wakeups"] == 8
    assert result.figures["p95_ms"] == pytest.approx(8.0, abs=1.0)
    assert "(goal <= 100 ms; stretch 10 ms met)" in result.summary
    slow = elastic.judge_reclaim("compute.elastic.reclaim", _reclaim_run(60))
    assert slow.status == report.PASS and "stretch 10 ms not met" in slow.summary


def test_reclaim_counts_from_when_the_waker_started_launching_where_gc_rt_says() -> None:
    run = _reclaim_run(8)
    # gc_rt's wake times: each burst began 3 ms before its first kernel started on the GPU.
    run.printed["waker"] = {"wakes": ",".join(str((300 + 500 * k) * MS - 3 * MS) for k in range(9))}
    result = elastic.judge_reclaim("compute.elastic.reclaim", run)
    assert result.figures["p95_ms"] == pytest.approx(11.0, abs=1.0)
    assert result.status == report.PASS and "stretch 10 ms not met" in result.summary


def test_reclaim_fails_past_100_ms_and_counts_wakes_never_reclaimed() -> None:
    result = elastic.judge_reclaim("compute.elastic.reclaim", _reclaim_run(150))
    assert result.status == report.FAIL
    assert result.figures["p95_ms"] == pytest.approx(150.0, abs=1.0)
    never = elastic.judge_reclaim("compute.elastic.reclaim", _reclaim_run(250))
    assert never.status == report.FAIL
    assert never.figures["never"] == never.figures["wakeups"] and never.figures["p95_ms"] is None
    assert "not within the 200 ms burst" in never.summary


# -- judging the colocation results ----------------------------------------------------------------------------
def _outcome(p99_alone: float, p99_beside: float, steps_beside: int, busy: float = 0.3) -> Outcome:
    serve = {"alone_p99_ms": str(p99_alone), "beside_p99_ms": str(p99_beside), "alone_busy": str(busy)}
    serve |= {"request_ms": "2.01", "request_batch": "24", "alone_requests": "600"}
    train = {"train_alone_steps": "300", "train_alone_seconds": "3.0", "beside_steps": str(steps_beside)}
    return Outcome(serve=serve, train=train | {"beside_seconds": "6.0"}, library_ms={"latency": 1800.0})


def test_latency_p99_within_ten_percent_of_alone_passes() -> None:
    result = colocation.judge_latency("compute.colocation.latency-p99", _outcome(2.2, 2.4, 300))
    assert result.status == report.PASS, result.summary
    assert result.figures["ratio"] == pytest.approx(2.4 / 2.2, abs=1e-4)
    assert "(goal <= 1.10 x)" in result.summary
    assert colocation.judge_latency("x", _outcome(2.2, 2.5, 300)).status == report.FAIL


def test_besteffort_must_keep_half_of_the_idle_time() -> None:
    # Alone 100 steps/s; beside 50 steps/s = half its speed, of the 70 % the requests leave idle: 71 %.
    result = colocation.judge_besteffort("compute.colocation.besteffort-share", _outcome(2.2, 2.4, 300))
    assert result.status == report.PASS, result.summary
    assert result.figures["share_of_idle"] == pytest.approx(0.5 / 0.7, abs=1e-4)
    assert "(goal >= 50 %)" in result.summary
    assert result.figures["library_used_ms_beside"] == {"latency": 1800.0}
    starved = colocation.judge_besteffort("x", _outcome(2.2, 2.4, 200))  # 33 % of its speed: 48 % of idle
    assert starved.status == report.FAIL


def test_a_run_that_broke_fails_both_colocation_results_with_why() -> None:
    broken = Outcome(problem="the server did not load its model within 300 s")
    assert colocation.judge_latency("x", broken).summary == (
        "no measurement: the server did not load its model within 300 s"
    )
    assert colocation.judge_besteffort("x", broken).status == report.FAIL


# -- what runs ---------------------------------------------------------------------------------------------------
def test_only_compute_elastic_runs_the_elastic_checks_not_every_compute_cap() -> None:
    names = [
        "compute.baseline",
        "compute",
        "compute.elastic.floors",
        "compute.elastic.reclaim",
        "compute.colocation",
    ]
    assert [n for n in names if selects(n, "compute.elastic", names)] == names[2:4]
    assert [n for n in names if selects(n, "compute.elastic.reclaim", names)] == ["compute.elastic.reclaim"]
    assert [n for n in names if selects(n, "compute.30pct.short", names)] == ["compute"]
    assert [n for n in names if selects(n, "compute", names)] == names


def test_without_root_or_the_limiter_the_elastic_results_are_skipped_with_why(tmp_path: Path) -> None:
    gpu = Gpu(0, UUID, "NVIDIA H200", 143771 * 2**20, "580.95.05")
    ctx = Context(
        root=ROOT, build=tmp_path, out=tmp_path, gpu=gpu, work=tmp_path, limiter_error="make failed"
    )
    ctx.programs["gc_rt_shared"] = tmp_path / "gc_rt"
    results = elastic.floors(ctx) + elastic.alone(ctx) + [elastic.reclaim(ctx)] + colocation.colocation(ctx)
    assert len(results) == 6 + 2 + 1 + 2
    assert {r.status for r in results} == {report.SKIP}
    assert {r.summary for r in results} == {"make failed"}
    assert results[0].name == "compute.elastic.floors.short.2-claims"


# -- the claims' files -----------------------------------------------------------------------------------------
CLAIMS = (Claim("lat", 30, 100, "latency"), Claim("fixed", 50), Claim("be", 10, 60, "besteffort"))


def test_the_claims_files_are_laid_out_as_the_agent_lays_them_out(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "l", UUID, CLAIMS, tmp_path / "claims-root", tmp_path / "gpus-root")
    gpu = tmp_path / "l/gpus" / UUID
    entries = project_board.read_board(gpu / "board")
    assert entries == sorted(project_board.Entry(c.uid, c.floor, c.top, c.priority) for c in CLAIMS)
    assert (gpu / "board").read_bytes()[16:24] != bytes(8), "written under the seqlock: seq moved on"
    assert (gpu / "board").stat().st_mode & 0o777 == 0o444
    for c in CLAIMS:
        activity = gpu / f"{c.uid}.activity"
        assert activity.read_bytes() == project_board.activity_header().ljust(4096, b"\0")
        assert activity.stat().st_mode & 0o777 == 0o666
        state = layout.state_dir(c.uid)
        assert (state / f"{UUID}.activity").samefile(activity), (
            "the claim's own file sits in its state directory"
        )
        region = (state / project_region.REGION_FILE).read_bytes()
        assert len(region) == project_region.REGION_BYTES
        assert region.startswith(project_region.header_fields())
        assert (layout.claim_dir(c.uid) / c.uid / "limits").stat().st_mode & 0o777 == 0o444
    limits = (layout.claim_dir("lat") / "lat" / "limits").read_text()
    assert limits == (
        f"version=1\nclaim=gpu-check/lat\nstate={tmp_path / 'claims-root/lat/limiter'}\n"
        f"device={UUID} memory=unlimited cores=30 limit=100 priority=latency\n"
    )
    assert (
        (layout.claim_dir("fixed") / "fixed/limits")
        .read_text()
        .endswith(f"device={UUID} memory=unlimited cores=50\n")
    ), "a fixed share's line is today's: no limit=, no priority="
    assert "cores=10 limit=60 priority=besteffort" in (layout.claim_dir("be") / "be/limits").read_text()


def test_the_mount_points_are_made_only_where_missing_and_removed_again(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with claims.laid_out(
        tmp_path / "l", UUID, CLAIMS[:1], tmp_path / "run/dra/claims", tmp_path / "run/dra/gpus"
    ):
        assert (tmp_path / "run/dra/claims").is_dir() and (tmp_path / "run/dra/gpus").is_dir()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == []


needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare (mount namespaces)"
)


@needs_namespaces
def test_a_claims_process_sees_only_its_claim_and_the_gpus_files_read_only(tmp_path: Path) -> None:
    claims_root, gpus_root = tmp_path / "root/claims", tmp_path / "root/gpus"
    with claims.laid_out(tmp_path / "l", UUID, CLAIMS, claims_root, gpus_root) as layout:
        script = (
            f"ls {claims_root}; cat {claims_root}/lat/limits; ls {gpus_root}/{UUID}; "
            f"echo x > {claims_root}/lat/limits || echo limits-read-only; "
            f"echo x > {gpus_root}/{UUID}/board || echo board-read-only; "
            f"grep -c ' {claims_root}/lat/limits ' /proc/self/mountinfo; echo preload=$LD_PRELOAD"
        )
        done = subprocess.run(
            layout.argv("lat", Path("/nowhere/lib.so"), ["sh", "-c", script]),
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"]},
            check=False,
        )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "lat", "only its own claim under the claims root"
    assert (
        "device=GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000 memory=unlimited cores=30 limit=100" in done.stdout
    )
    assert "board" in lines and "fixed.activity" in lines
    assert "limits-read-only" in lines and "board-read-only" in lines
    assert lines[-2] == "1", "the limits file is a mount of its own"
    assert lines[-1] == "preload=/nowhere/lib.so"
    assert not (tmp_path / "root").exists(), "the mount points made for it are gone; nothing was mounted here"


# -- against the real library, on the fake driver --------------------------------------------------------------
LAUNCHER = r"""
#include "cuda_min.h"
#include <stdio.h>
#include <stdlib.h>
/* Launches N kernels of 5 waves (50 us on the fake) on device 0 and waits for them. */
int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction fn; CUstream s;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&mod, "image") || cuModuleGetFunction(&fn, mod, "small") || cuStreamCreate(&s, 0))
        return 3;
    for (int i = 0; i < atoi(argv[1]); i++)
        if (cuLaunchKernel(fn, 132 * 5, 1, 1, 128, 1, 1, 0, s, NULL, NULL)) return 4;
    if (cuStreamSynchronize(s)) return 5;
    printf("launched\n");
    return 0;
}
"""


@pytest.fixture(scope="module")
def elastic_library(built: Path) -> Path:
    """The tests' build of the library (limits and board under native/limiter/build), where it does elastic
    compute."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("cc") is None:
        pytest.skip("needs root, unshare and cc")
    made = subprocess.run(
        ["make", "-s", "-C", str(LIMITER), "build/testroot/libdragpu-limiter.so.1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    library = LIMITER / "build/testroot/libdragpu-limiter.so.1"
    return library


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("launcher")
    (work / "launcher.c").write_text(LAUNCHER)
    cc = ["cc", "-O2", f"-I{LIMITER / 'src'}", "-o", str(work / "launcher"), str(work / "launcher.c")]
    built = subprocess.run(
        [*cc, f"-L{LIMITER / 'build/fake'}", "-lcuda"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return work / "launcher"


def _launch(layout: Layout, uid: str, library: Path, launcher: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "LD_LIBRARY_PATH": str(LIMITER / "build/fake"),
        "FAKE_CUDA_CTX_BYTES": "0",
    }
    return subprocess.run(
        layout.argv(uid, library, [launcher, "400"]),
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


@pytest.mark.limiter
def test_the_library_takes_a_claim_so_laid_out_into_arbitration(
    tmp_path: Path, elastic_library: Path, launcher: Path
) -> None:
    build = LIMITER / "build"
    with claims.laid_out(tmp_path / "l", UUID, CLAIMS[:2], build / "claims", build / "gpus") as layout:
        done = _launch(layout, "lat", elastic_library, launcher)
        assert done.returncode == 0 and "launched" in done.stdout, done.stdout + done.stderr
        assert claims.refusal(done.stderr) == "", done.stderr
        activity = layout.activity("lat")
        assert activity is not None and activity.used_ns > 0, (
            "the library charges the claim in its activity file"
        )
        assert activity.borrowed_ns > 0, "alone, a 30-100 % claim borrows above its floor"
        # A board the claim could have written is not trusted: the claim runs its fixed floor, one line.
        (layout.gpu_dir / "board").chmod(0o666)
        os.chown(layout.gpu_dir / "board", 1, 1)
        done = _launch(layout, "fixed", elastic_library, launcher)
        assert done.returncode == 0, done.stderr
        refused = claims.refusal(done.stderr)
        assert refused.startswith("the library did not take the claim into arbitration: dragpu-limiter: "), (
            done.stderr
        )
        assert "runs its fixed floor of 50%" in refused
        assert layout.activity("fixed").used_ns == 0


# -- the checks end to end, with stand-ins for the CUDA program and PyTorch, in the claims' namespaces --------
FAKE_BUSY = r"""#!/usr/bin/env python3
# Stands in for `gc_rt busy SECONDS KERNEL_US --ready [--graph N] --out FILE` in a claim's mount namespace: it
# finds its own claim's limits file where the library does (the only one it sees), then holds the GPU from
# START to END us of each millisecond for 2 s (FAKE_SPANS=uid:START:END,...) and charges that to the claim's
# activity file as the library does.
import glob, os, struct, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
(limits,) = glob.glob(os.environ["FAKE_CLAIMS_ROOT"] + "/*/limits")
uid = limits.split("/")[-2]
lines = open(limits).read().splitlines()
state = next(line[len("state="):] for line in lines if line.startswith("state="))
print(next(line for line in lines if line.startswith("device=")))
print("ready", flush=True)
sys.stdin.read(1)
start, end = next(map(int, s.split(":")[1:]) for s in os.environ["FAKE_SPANS"].split(",") if s.startswith(uid + ":"))
nodes = int(args[args.index("--graph") + 1]) if "--graph" in args else 1
with open(out, "wb") as f:
    for p in range(2000):
        s, e = p * 1_000_000 + start * 1000, p * 1_000_000 + end * 1000
        for k in range(nodes):
            ks, ke = s + (e - s) * k // nodes, s + (e - s) * (k + 1) // nodes
            f.write(struct.pack("<QQQ", ks, ke, ke))
(activity,) = glob.glob(state + "/*.activity")
with open(activity, "r+b") as f:
    f.seek(24)
    f.write(struct.pack("<q", 2000 * (end - start) * 1000))
print("launches=2000")
"""


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Context:
    """A context whose claims are laid out under tmp_path (not /run) and whose library is never loaded."""
    monkeypatch.setattr(claims, "CLAIMS_ROOT", tmp_path / "run/claims")
    monkeypatch.setattr(claims, "GPUS_ROOT", tmp_path / "run/gpus")
    monkeypatch.setenv("FAKE_CLAIMS_ROOT", str(tmp_path / "run/claims"))
    gpu = Gpu(0, UUID, "NVIDIA H200", 143771 * 2**20, "580.95.05")
    (tmp_path / "work").mkdir()
    ctx = Context(root=ROOT, build=tmp_path, out=tmp_path, gpu=gpu, work=tmp_path / "work", quick=True)
    ctx.limiter = tmp_path / "libnothing.so"  # loaded by no one: ld.so says so and goes on
    return ctx


@needs_namespaces
def test_floors_run_each_claim_in_its_namespace_together_and_judge_what_the_gpu_gave_each(
    node: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = tmp_path / "gc_rt"
    busy.write_text(FAKE_BUSY)
    busy.chmod(0o755)
    node.programs["gc_rt_shared"] = busy
    monkeypatch.setenv("FAKE_SPANS", "a:0:480,b:480:1000,c:0:0,d:0:0")  # the pairs: 48 % and 52 %
    results = {r.name: r for r in elastic.floors(node)}
    pair = results["compute.elastic.floors.graph.2-claims"]
    assert pair.status == report.PASS, pair.summary
    assert pair.figures["held_percent"] == {"a": pytest.approx(48.0), "b": pytest.approx(52.0)}
    assert pair.figures["library"]["b"] == {"used_ms": 1040.0, "borrowed_ms": 0.0}, (
        "read from its activity file"
    )
    assert f"device={UUID} memory=unlimited cores=30 limit=100" in "\n".join(pair.details)
    quad = results["compute.elastic.floors.long.4-claims"]
    assert quad.status == report.FAIL, "c and d never ran: no common window"
    assert quad.summary == "no measurement: claim c recorded no kernel"
    assert not (tmp_path / "run").exists(), "the mount points were made for the runs and removed"


FAKE_PYTHON = r"""#!/bin/sh
# Stands in for the workloads' Python: `colocation.py serve ...` and `colocation.py train` answer the commands
# with fixed figures; in the shared phase each charges its claim's activity file, as the library does.
shift
echo loaded
while read -r command phase seconds; do
  case "$1 $command" in
    "serve calibrate") echo request_batch=24; echo request_ms=2.0 ;;
    "train warm") echo step_ms=10.0 ;;
    "serve run") echo "${phase}_p99_ms=$( [ "$phase" = alone ] && echo 2.0 || echo 2.1 )"; echo "${phase}_busy=0.3" ;;
    "train run") echo "${phase}_steps=$( [ "$phase" = beside ] && echo 240 || echo 300 )"; echo "${phase}_seconds=3.0" ;;
  esac
  if [ "$phase" = beside ]; then
    python3 -c 'import glob, struct, sys; f = open(glob.glob(sys.argv[1] + "/*/limits")[0]).read().split("state=")[1].split()[0]; a = open(glob.glob(f + "/*.activity")[0], "r+b"); a.seek(24); a.write(struct.pack("<q", int(sys.argv[2])))' "$FAKE_CLAIMS_ROOT" "$( [ "$1" = serve ] && echo 900000000 || echo 1500000000 )"
  fi
  echo "done $command${phase:+ $phase}${seconds:+ $seconds}"
done
"""


@needs_namespaces
def test_colocation_runs_the_phases_in_order_in_the_claims_namespaces(node: Context, tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    node.framework_python = str(python)
    latency, besteffort = colocation.colocation(node)
    assert latency.status == report.PASS, latency.summary + "\n".join(latency.details)
    assert latency.figures["ratio"] == pytest.approx(1.05) and latency.figures["request_batch"] == 24
    # 240 steps in 3 s beside, 300 alone: 80 % of its speed, of the 70 % the requests leave idle.
    assert besteffort.status == report.PASS, besteffort.summary
    assert besteffort.figures["share_of_idle"] == pytest.approx(0.8 / 0.7, abs=1e-4)
    assert besteffort.figures["library_used_ms_beside"] == {"latency": 900.0, "besteffort": 1500.0}
    assert besteffort.figures["library_held_ms_beside"] == {"latency": 0.0, "besteffort": 0.0}
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: gc_rt cannot be built")
def test_gc_rt_takes_bursts_of_on_and_off_milliseconds() -> None:
    built = build_programs(ROOT / "build/gpu-check")
    assert "gc_rt_shared" in built.programs, built.errors
    busy = [str(built.programs["gc_rt_shared"]), "busy", "1", "50"]
    for bad in (["--bursts", "200"], ["--bursts", "200", "0"], ["--bursts", "-1", "300"]):
        done = subprocess.run([*busy, *bad], capture_output=True, text=True, check=False, timeout=60)
        assert done.returncode == 2 and "[--bursts ON-MS OFF-MS]" in done.stderr, bad
    done = subprocess.run(
        [*busy, "--bursts", "200", "300"], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode == 0:
        pytest.skip("this machine has a GPU: the bursts ran")
    assert done.returncode == 3, "accepted: it went on to set up CUDA, which there is none of here"
