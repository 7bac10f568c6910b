"""The framework workloads of the GPU check: verdicts on their output, nvidia-smi's per-process usage,
the skip when a framework is missing, and the steps the check drives a workload through.

The workload outputs below are in the format `gpucheck/workloads/frameworks.py` prints, with the
figures of the first real H100 run (a 4 GiB cap, a context of about 518 MiB) and the frameworks' own
out-of-memory messages.
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
from repo_paths import ROOT

sys.path.insert(0, str(ROOT))

from gpucheck import report
from gpucheck.checks import frameworks
from gpucheck.checks.frameworks import Usage, judge_framework, usage_of
from gpucheck.context import Context
from gpucheck.gpu import Gpu
from gpucheck.parse import key_values

MIB = 1024 * 1024
GIB = 1024 * MIB
CAP = 4 * GIB
CHUNK = 256 * MIB
UUID = "GPU-33151d3a-4898-e60b-e2b4-0f4a4f16a6a3"
VARIANTS = {v.name: v for v in frameworks.VARIANTS}

TORCH_OOM = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has a total capacity of "
    "4.00 GiB of which 230.00 MiB is free."
)
TORCH_FILLED = f"version=2.11.0+cu130\ntotal={CAP}\nfree={CAP - 300 * MIB}\nready\nallocated={14 * CHUNK}\nstopped={TORCH_OOM}\nholding\ndone\n"
TORCH_GRAPH = (
    f"version=2.11.0+cu130\ntotal={CAP}\nfree={CAP - 300 * MIB}\nready\ngraph=ok\ngraph_bytes={CHUNK}\n"
    f"allocated={14 * CHUNK}\nstopped={TORCH_OOM}\nholding\ndone\n"
)
CAPTURE_FAILED = (
    "version=2.11.0+cu130\ntotal=4294967296\nfree=3980394496\nready\n"
    "graph_error=AcceleratorError: CUDA error: operation failed due to a previous error during capture\n"
)
JAX_PREALLOC = (
    f"version=0.11.0\ntotal={int(0.75 * CAP)}\nready\nallocated={11 * CHUNK}\n"
    "stopped=JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 268435456 bytes.\n"
    "holding\ndone\n"
)
CUPY_FILLED = (
    f"version=14.0.0\ntotal={CAP}\nfree={CAP - 300 * MIB}\nready\nallocated={14 * CHUNK}\n"
    "stopped=OutOfMemoryError: Out of memory allocating 268,435,456 bytes (allocated so far: 3,758,096,384 bytes).\n"
    "holding\ndone\n"
)
SEEN = Usage(context=518 * MIB, peak=518 * MIB + 14 * CHUNK)


def judge(variant: str, output: str, usage: Usage = SEEN, bare: str | None = None) -> report.Result:
    return judge_framework(
        f"framework.{variant}",
        VARIANTS[variant],
        CAP,
        CHUNK,
        key_values(output),
        usage,
        True,
        "exit 0",
        key_values(bare) if bare is not None else None,
    )


# -- verdicts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "output"),
    [("torch.default", TORCH_FILLED), ("cupy.async", CUPY_FILLED), ("jax.prealloc", JAX_PREALLOC)],
)
def test_a_framework_that_sees_the_cap_and_stops_there_passes(variant: str, output: str) -> None:
    result = judge(variant, output)
    assert result.status == report.PASS, result.summary
    assert result.figures["allocated"] == int(key_values(output)["allocated"])


def test_the_pass_names_the_cap_the_allocation_and_what_nvidia_smi_showed() -> None:
    result = judge("torch.default", TORCH_FILLED)
    assert result.summary.startswith("total 4096 MiB under a 4096 MiB cap; allocated 3584 MiB")
    assert "nvidia-smi: 4102 MiB at the peak, context 518 MiB" in result.summary


def test_the_physical_total_fails() -> None:
    output = TORCH_FILLED.replace(f"total={CAP}", "total=85520809984")
    result = judge("torch.default", output)
    assert result.status == report.FAIL
    assert "total 85520809984 != cap 4294967296" in result.summary


def test_no_out_of_memory_before_twice_the_cap_fails() -> None:
    output = f"total={CAP}\nready\nallocated={2 * CAP}\nstopped=\nholding\n"
    result = judge("torch.expandable", output, Usage(518 * MIB, 518 * MIB + 2 * CAP))
    assert result.status == report.FAIL
    assert "no out-of-memory error before 8192 MiB" in result.summary
    assert "allocated 8192 MiB > cap 4096 MiB" in result.summary
    assert "over cap + context" in result.summary


def test_an_error_other_than_out_of_memory_fails() -> None:
    output = TORCH_FILLED.replace(TORCH_OOM, "AcceleratorError: CUDA error: invalid argument")
    result = judge("torch.async", output)
    assert result.status == report.FAIL
    assert "stopped by AcceleratorError: CUDA error: invalid argument, not out-of-memory" in result.summary


def test_stopping_more_than_context_and_a_chunk_below_the_cap_fails() -> None:
    output = TORCH_FILLED.replace(f"allocated={14 * CHUNK}", f"allocated={12 * CHUNK}")
    result = judge("torch.default", output, Usage(518 * MIB, 518 * MIB + 12 * CHUNK))
    assert result.status == report.FAIL
    assert "stopped at 3072 MiB, below 3322 MiB" in result.summary


def test_usage_over_cap_and_context_fails_even_when_the_framework_stopped_at_the_cap() -> None:
    result = judge("cupy.pool", CUPY_FILLED, Usage(context=518 * MIB, peak=CAP + 600 * MIB))
    assert result.status == report.FAIL
    assert "nvidia-smi shows 4696 MiB at the peak, over cap + context 4630 MiB" in result.summary


def test_a_process_nvidia_smi_does_not_list_fails_and_says_so() -> None:
    usage = Usage(problem="nvidia-smi does not list process 4242 (another PID namespace?)")
    result = judge("torch.default", TORCH_FILLED, usage)
    assert result.status == report.FAIL
    assert "the process's usage was not read: nvidia-smi does not list process 4242" in result.summary


def test_without_nvidia_smi_the_usage_is_not_judged_and_the_summary_says_why() -> None:
    result = judge("torch.default", TORCH_FILLED, Usage(problem="nvidia-smi not found", unmeasurable=True))
    assert result.status == report.PASS
    assert result.summary.endswith("usage not read (nvidia-smi not found)")


def test_jax_limit_must_be_its_fraction_of_the_cap_not_of_the_gpu() -> None:
    output = JAX_PREALLOC.replace(f"total={int(0.75 * CAP)}", f"total={int(0.75 * 85520809984)}")
    result = judge("jax.prealloc", output)
    assert result.status == report.FAIL
    assert "allocator limit 64140607488 is neither the cap 4294967296 nor 0.75 of it" in result.summary


def test_jax_without_preallocation_may_stop_a_tenth_short_of_what_the_cap_leaves() -> None:
    output = f"total={CAP}\nready\nallocated={13 * CHUNK}\nstopped=JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory\n"
    # XLA's regions of 256, 512 and 1024 MiB, then one of 1659 MiB after backing off once: 13 chunks
    assert judge("jax.on-demand", output, Usage(600 * MIB, 600 * MIB + 13 * CHUNK)).status == report.PASS
    short = output.replace(f"allocated={13 * CHUNK}", f"allocated={11 * CHUNK}")
    result = judge("jax.on-demand", short, Usage(600 * MIB, 600 * MIB + 11 * CHUNK))
    assert result.status == report.FAIL
    assert "stopped at 2816 MiB, below 2890 MiB" in result.summary


def test_jax_may_report_the_whole_cap_where_its_pool_grows_to_the_total() -> None:
    output = JAX_PREALLOC.replace(f"total={int(0.75 * CAP)}", f"total={CAP}")
    assert judge("jax.prealloc", output).status == report.PASS


def test_a_capture_that_fails_without_the_preload_is_skipped_with_its_error() -> None:
    result = judge("torch.async.graph", "", bare=CAPTURE_FAILED)
    assert result.status == report.SKIP
    assert result.summary == (
        "the capture fails without the preload too: AcceleratorError: CUDA error: operation failed due to "
        "a previous error during capture"
    )


def test_a_capture_that_works_without_the_preload_and_fails_with_it_fails() -> None:
    bare = "total=85520809984\nready\ngraph=ok\ngraph_bytes=268435456\nholding\ndone\n"
    result = judge("torch.async.graph", CAPTURE_FAILED, bare=bare)
    assert result.status == report.FAIL
    assert result.summary.startswith(
        "the capture works without the preload and fails with it: AcceleratorError"
    )


def test_a_capture_that_works_both_ways_is_judged_like_any_fill() -> None:
    bare = "ready\ngraph=ok\ngraph_bytes=268435456\nholding\ndone\n"
    result = judge("torch.default.graph", TORCH_GRAPH, bare=bare)
    assert result.status == report.PASS, result.summary
    assert "(graph memory included)" in result.summary


def test_a_missing_framework_is_a_skip_with_the_workloads_reason() -> None:
    result = judge("jax.on-demand", "skip=JAX is not importable (No module named 'jax')\n")
    assert result.status == report.SKIP
    assert result.summary == "JAX is not importable (No module named 'jax')"


# -- nvidia-smi per process --------------------------------------------------------------------------


def test_usage_is_read_for_the_process_in_mib() -> None:
    text = "1234, 600\n4242, 4102\n"
    assert usage_of(text, 4242) == (4102 * MIB, "")
    assert usage_of(text, 7) == (None, "nvidia-smi does not list process 7 (another PID namespace?)")
    assert usage_of("4242, [N/A]\n", 4242) == (None, "nvidia-smi shows no used memory for process 4242 (N/A)")


# -- the check, driven against stand-ins for the framework's Python and nvidia-smi --------------------

FAKE_SMI = """#!/bin/sh
case "$*" in
  *"--query-compute-apps=pid,used_memory"*)
    [ -f "$STATE.pid" ] && echo "$(cat "$STATE.pid"), $(cat "$STATE.used")" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""

# A stand-in for the framework's Python: it goes through the workload's steps, waiting where the
# workload waits, and shows nvidia-smi its usage (518 MiB of context, then 14 chunks more).
FAKE_PYTHON = """#!/bin/sh
echo "$2 $3 preload=${LD_PRELOAD:-none} alloc=${PYTORCH_CUDA_ALLOC_CONF:-}${XLA_PYTHON_CLIENT_PREALLOCATE:-} $*" >> "$STATE.runs"
if [ "$2" != torch ]; then echo "skip=$2 is not importable (No module named '$2')"; exit 0; fi
echo $$ > "$STATE.pid"; echo 518 > "$STATE.used"
echo total=4294967296; echo ready
read step
case "$*" in *graph*) echo graph=ok; echo graph_bytes=268435456 ;; esac
case "$*" in *no-fill*) ;; *)
  echo 4102 > "$STATE.used"
  echo allocated=3758096384; echo "stopped=OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB" ;;
esac
echo holding
read step
echo done
"""


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Context:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-smi", FAKE_SMI), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("STATE", str(tmp_path / "state"))
    gpu = Gpu(0, UUID, "NVIDIA H100 80GB HBM3", 81559 * MIB, "580.159.04")
    ctx = Context(root=ROOT, build=tmp_path, out=tmp_path, gpu=gpu, work=tmp_path)
    ctx.limiter = tmp_path / "libdragpu-limiter.so.1"
    ctx.framework_python = str(bin_dir / "python")
    return ctx


def test_each_variant_is_run_through_its_steps_captures_first_without_the_preload(
    node: Context, tmp_path: Path
) -> None:
    results = {r.name: r for r in frameworks.frameworks(node)}
    assert list(results) == [f"framework.{v.name}" for v in frameworks.VARIANTS]
    for variant in ("torch.default", "torch.default.graph", "torch.expandable.graph", "torch.async"):
        result = results[f"framework.{variant}"]
        assert result.status == report.PASS, (variant, result.summary, result.details)
        assert result.figures["context_bytes"] == 518 * MIB
        assert result.figures["peak_usage_bytes"] == 4102 * MIB
    runs = (tmp_path / "state.runs").read_text().splitlines()
    torch_runs = [r for r in runs if r.startswith("torch ")]
    # torch.default under the preload; torch.default.graph without it (capture only), then with it
    assert [r.split()[2] for r in torch_runs[:3]] == [
        f"preload={node.limiter}",
        "preload=none",
        f"preload={node.limiter}",
    ]
    assert torch_runs[1].endswith("graph no-fill") and torch_runs[2].endswith("graph")
    assert len(torch_runs) == 9
    assert "alloc=backend:cudaMallocAsync" in torch_runs[-1]


def test_a_missing_framework_skips_its_variants_with_the_reason_and_runs_it_once(
    node: Context, tmp_path: Path
) -> None:
    results = {r.name: r for r in frameworks.frameworks(node)}
    for variant in ("cupy.pool", "cupy.async", "jax.prealloc", "jax.on-demand"):
        result = results[f"framework.{variant}"]
        assert result.status == report.SKIP
        assert (
            result.summary
            == f"{variant.split('.')[0]} is not importable (No module named '{variant.split('.')[0]}')"
        )
    runs = (tmp_path / "state.runs").read_text().splitlines()
    assert sum(r.startswith("cupy ") for r in runs) == 1
    assert sum(r.startswith("jax ") for r in runs) == 1


def test_a_framework_python_that_is_not_there_skips_every_variant_naming_the_setting(node: Context) -> None:
    node.framework_python = "/nonexistent/bin/python3"
    results = frameworks.frameworks(node)
    assert {r.status for r in results} == {report.SKIP}
    assert results[0].summary.startswith("/nonexistent/bin/python3 not found or not executable")
    assert "GPU_CHECK_FRAMEWORK_PYTHON" in results[0].summary


def test_without_the_limiter_every_variant_is_skipped_with_the_build_error(node: Context) -> None:
    node.limiter = None
    node.limiter_error = "the limiter did not build: make failed"
    results = frameworks.frameworks(node)
    assert {r.summary for r in results} == {"the limiter did not build: make failed"}


# -- the whole check on the limiter's fake driver, where no framework is installed --------------------

FAKE = ROOT / "native/limiter/build/fake"


@pytest.mark.slow
@pytest.mark.limiter
@pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None or shutil.which("nvcc") is None,
    reason="needs nvcc and no real GPU (the fake GPU is found only where nvidia-smi is absent)",
)
@pytest.mark.usefixtures("built")  # builds the limiter and its fake driver; fails if they do not build
def test_make_gpu_check_skips_each_framework_that_its_python_lacks(tmp_path: Path) -> None:
    assert importlib.util.find_spec("pynvml"), "the fake GPU is found through NVML: install nvidia-ml-py"
    lacking = [f for f in ("torch", "cupy", "jax") if importlib.util.find_spec(f) is None]
    if not lacking:
        pytest.skip("this Python has PyTorch, CuPy and JAX: nothing is missing")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_CHECK_", "DRAGPU_"))}
    env.update(
        LD_LIBRARY_PATH=str(FAKE),
        GPU_CHECK_OUT=str(tmp_path / "out"),
        GPU_CHECK_FRAMEWORK_PYTHON=sys.executable,
    )
    root = ROOT
    done = subprocess.run(
        [sys.executable, "-m", "gpucheck", "--only", "framework"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    data = json.loads((tmp_path / "out/report.json").read_text())
    results = {r["name"]: r for r in data["results"]}
    assert set(results) == {f"framework.{v.name}" for v in frameworks.VARIANTS}, done.stdout
    names = {"torch": "PyTorch", "cupy": "CuPy", "jax": "JAX"}
    for name, result in results.items():
        framework = name.split(".")[1]
        if framework in lacking:
            assert result["status"] == "skip", done.stdout
            assert result["summary"].startswith(f"{names[framework]} is not importable"), result["summary"]
