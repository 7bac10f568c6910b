"""The serving checks of the GPU check: verdicts on what `gpucheck/workloads/serving.py` prints (NCCL with one
rank, a decode loop to the cap, the memory-profiling sequence), and their skip without the limiter or
PyTorch. The figures are in the workload's format, for a 4 GiB cap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from repo_paths import ROOT

sys.path.insert(0, str(ROOT))

from gpucheck import report
from gpucheck.checks import CHECKS, serving
from gpucheck.checks.serving import judge_decode, judge_nccl, judge_profile
from gpucheck.context import Context
from gpucheck.gpu import Gpu
from gpucheck.parse import key_values

MIB = 1024 * 1024
CAP = 4096 * MIB
TORCH_OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 MiB."


def kv(text: str) -> dict[str, str]:
    return key_values(text)


def nccl(total: int, before: int, after: int, allreduce: str = "ok") -> dict[str, str]:
    return kv(
        f"version=2.11\nallreduce={allreduce}\nnccl=2.27.3\ntotal={total}\nfree_before={before}\nfree_after={after}\nfinished=1\n"
    )


def test_nccl_passes_when_the_claim_pays_what_the_device_does() -> None:
    bare = nccl(80 * 1024 * MIB, 79000 * MIB, 78900 * MIB)
    limited = nccl(CAP, 3500 * MIB, 3396 * MIB)
    assert judge_nccl(CAP, bare, limited).status == report.PASS


def test_nccl_fails_when_host_memory_is_charged_as_gpu_memory() -> None:
    bare = nccl(80 * 1024 * MIB, 79000 * MIB, 78900 * MIB)
    limited = nccl(CAP, 3500 * MIB, 3000 * MIB)  # 500 MiB charged for 100 MiB of the device
    result = judge_nccl(CAP, bare, limited)
    assert result.status == report.FAIL and "host memory is charged" in result.summary


def test_nccl_fails_when_the_all_reduce_fails() -> None:
    bare = nccl(80 * 1024 * MIB, 79000 * MIB, 78900 * MIB)
    limited = nccl(CAP, 3500 * MIB, 3400 * MIB, allreduce="DistBackendError: NCCL error")
    assert judge_nccl(CAP, bare, limited).status == report.FAIL


def test_decode_to_the_cap_then_serving_again_passes_and_a_cache_past_the_cap_fails() -> None:
    ok = kv(f"steps=1700\ncache_bytes={3400 * MIB}\nstopped={TORCH_OOM}\nserved=ok\nfinished=1\n")
    assert judge_decode(CAP, ok).status == report.PASS
    past = kv(f"steps=2100\ncache_bytes={4200 * MIB}\nstopped={TORCH_OOM}\nserved=ok\n")
    assert "past the cap" in judge_decode(CAP, past).summary
    stuck = kv(f"steps=1700\ncache_bytes={3400 * MIB}\nstopped={TORCH_OOM}\nserved=OutOfMemoryError: x\n")
    assert "did not serve again" in judge_decode(CAP, stuck).summary
    other = kv(
        f"steps=3\ncache_bytes={6 * MIB}\nstopped=RuntimeError: CUDA error: an illegal memory access\n"
    )
    assert judge_decode(CAP, other).status == report.FAIL


def test_profiling_figures_must_agree_with_the_cap() -> None:
    good = kv(
        f"total={CAP}\nfree_before={3500 * MIB}\nfree_warm={3300 * MIB}\nfree_after={3280 * MIB}\n"
        f"torch_reserved={220 * MIB}\ncache=ok\nfinished=1\n"
    )
    assert judge_profile(CAP, good).status == report.PASS
    physical = dict(good, total=str(80 * 1024 * MIB))
    assert "!= cap" in judge_profile(CAP, physical).summary
    uncharged = dict(good, free_after=str(4000 * MIB), free_warm=str(4000 * MIB), free_before=str(4000 * MIB))
    assert "more than the cap less PyTorch's" in judge_profile(CAP, uncharged).summary
    refused = dict(good, cache="OutOfMemoryError: CUDA out of memory.")
    assert "could not be allocated" in judge_profile(CAP, refused).summary


def test_the_serving_checks_are_skipped_without_the_limiter(tmp_path: Path) -> None:
    ctx = Context(root=ROOT, build=tmp_path, out=tmp_path, gpu=Gpu(0, "GPU-0", "x", 80 << 30, "580"))
    results = serving.serving(ctx)
    assert [r.name for r in results] == list(serving.NAMES)
    assert all(r.status == report.SKIP for r in results)
    assert ("serving", serving.serving) in CHECKS


def test_the_workload_skips_without_a_gpu() -> None:
    """Here no GPU is visible (or PyTorch is missing): it says so instead of failing."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "gpucheck/workloads/serving.py"), "decode", str(CAP)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0 and "skip" in kv(done.stdout), done.stdout + done.stderr
