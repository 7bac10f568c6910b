"""The GPU check's parsing, verdicts, summary and exit status, on recorded program and tool output."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import zipfile
from pathlib import Path

import pytest
from repo_paths import ROOT

sys.path.insert(0, str(ROOT))

from gpucheck import bundle, parse, report
from gpucheck.checks import compute, gpu_settings, inventory, memory, overhead
from gpucheck.context import Context
from gpucheck.driver import run_check
from gpucheck.gpu import Gpu, gpus_from_smi, pick
from gpucheck.proc import Ran
from gpucheck.sampler import UtilizationSampler

MIB = 1024 * 1024
CAP = 3000 * MIB
UUID = "GPU-5e8b4c2a-1d3f-4a6b-9c7d-0e1f2a3b4c5d"

# `gc_drv info` and `gc_drv family mem` under the limiter with a 3000 MiB cap (recorded).
INFO = f"total={CAP}\nfree={CAP}\ndevice_total={CAP}\nuuid={UUID}\n"
FILL = (
    f"allocated={CAP}\ncount=26\nlast=CUDA_ERROR_OUT_OF_MEMORY\nstopped=refused\n"
    f"after_total={CAP}\nafter_free=0\n"
)
# The same program without the limiter on an 80 GiB GPU: nothing stops it before its maximum.
FILL_UNLIMITED = f"allocated={2 * CAP}\ncount=23\nlast=CUDA_SUCCESS\nstopped=max\n"

SMI_QUERY = (
    f"0, {UUID}, NVIDIA H100 80GB HBM3, 81559, 580.95.05, Default, Disabled\n"
    "1, GPU-00000000-1111-2222-3333-444444444444, NVIDIA L4, 23034, 580.95.05, Default, [N/A]\n"
)


def ran(stdout: str = "", rc: int | None = 0, problem: str = "") -> Ran:
    return Ran(["prog"], rc, stdout, "", 0.1, problem)


# -- parsing -----------------------------------------------------------------------------------------
def test_key_values_takes_assignments_and_ignores_other_lines() -> None:
    values = parse.key_values("alloc 0 ok\nallocated=42\nholding\nlast=CUDA_SUCCESS\nallocated=43\n")
    assert values == {"allocated": "43", "last": "CUDA_SUCCESS"}
    assert parse.int_of(values, "allocated") == 43
    assert parse.int_of(values, "last") is None
    assert parse.int_of(values, "missing") is None


def test_nvidia_smi_query_rows_with_not_available_fields() -> None:
    gpus = gpus_from_smi(SMI_QUERY)
    assert [g.uuid for g in gpus] == [UUID, "GPU-00000000-1111-2222-3333-444444444444"]
    assert gpus[0].memory_bytes == 81559 * MIB
    assert gpus[0].mig_mode == "Disabled"
    assert gpus[1].mig_mode == "", "[N/A] is no value"
    assert pick(gpus, "") is gpus[0]
    assert pick(gpus, "1") is gpus[1]
    assert pick(gpus, UUID) is gpus[0]
    assert pick(gpus, "7") is None


def test_nvidia_smi_row_of_the_wrong_width_is_an_error() -> None:
    with pytest.raises(ValueError, match="printed 2 fields where 3 were asked"):
        parse.smi_csv("a, b\n", ("x", "y", "z"))


def test_nvidia_smi_list_skips_mig_devices() -> None:
    text = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)\n"
        "  MIG 1g.5gb     Device  0: (UUID: MIG-11111111-2222-3333-4444-555555555555)\n"
    )
    assert parse.smi_gpus(text) == [
        {"index": "0", "name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"}
    ]


def test_busy_fraction_is_the_union_of_intervals_over_the_trimmed_window() -> None:
    # Two processes: [0,10) and [5,20) overlap, [30,40) alone; window 0..40.
    intervals = [(0, 10), (5, 20), (30, 40)]
    busy, window = parse.busy_fraction(intervals)
    assert window == 40
    assert busy == pytest.approx(30 / 40)
    busy, window = parse.busy_fraction(intervals, trim_ns=5)  # window 5..35: busy 5..20 and 30..35
    assert window == 30
    assert busy == pytest.approx(20 / 30)
    assert parse.busy_fraction([]) == (0.0, 0)


def test_kernels_are_read_as_little_endian_triples_and_a_torn_tail_ignored() -> None:
    data = struct.pack("<QQQQQQ", 100, 240, 250, 300, 300, 300) + b"\x01\x02"
    assert parse.kernels_from_bytes(data) == [(100, 240, 250), (300, 300, 300)]


def test_a_launch_holds_the_gpu_from_its_first_kernel_start_to_its_last_kernel_end() -> None:
    # Two graphs of two kernels each: the gaps between nodes are the graph's; a graph with a kernel
    # that never ran is left out rather than stretched.
    kernels = [(0, 8, 10), (12, 20, 22), (30, 38, 40), (42, 42, 42)]
    assert parse.launch_spans(kernels, 2) == [(0, 22)]
    assert parse.launch_spans(kernels) == [(0, 10), (12, 22), (30, 40)]
    assert parse.spin_spans(kernels) == [(0, 8), (12, 20), (30, 38)]


# -- verdicts on recorded output ------------------------------------------------------------------------
def test_cap_passes_when_total_is_exactly_the_cap_and_allocation_stops_there() -> None:
    result = memory.judge_cap(
        "limiter.cap.driver-api", CAP, 80 * 1024 * MIB, parse.key_values(INFO), parse.key_values(FILL)
    )
    assert result.status == report.PASS
    assert result.figures["reported_total"] == CAP
    assert result.figures["shortfall"] == 0


def test_cap_fails_when_the_limiter_did_not_hold() -> None:
    info = parse.key_values(f"total={80 * 1024 * MIB}\nfree=1\n")
    result = memory.judge_cap("c", CAP, 80 * 1024 * MIB, info, parse.key_values(FILL_UNLIMITED))
    assert result.status == report.FAIL
    assert f"memory-info total {80 * 1024 * MIB} != cap {CAP}" in result.summary
    assert "allocated 6000 MiB > cap 3000 MiB" in result.summary
    assert "ended with CUDA_SUCCESS, not out-of-memory" in result.summary


def test_cap_fails_when_usable_memory_stops_far_below_the_cap() -> None:
    fill = parse.key_values(f"allocated={CAP - 1024 * MIB}\nlast=CUDA_ERROR_OUT_OF_MEMORY\n")
    result = memory.judge_cap("c", CAP, 80 * 1024 * MIB, parse.key_values(INFO), fill)
    assert result.status == report.FAIL
    assert "stopped 1024 MiB below the cap" in result.summary


def test_cap_follows_the_context_rule_when_the_context_is_known() -> None:
    # The first H100 run: one process got 2718 MiB of 3000 while its context took 523.6 MiB (549 MB).
    context = 548995072
    recorded = parse.key_values(f"allocated={2718 * MIB}\nlast=CUDA_ERROR_OUT_OF_MEMORY\n")
    result = memory.judge_cap("c", CAP, 80 * 1024 * MIB, parse.key_values(INFO), recorded, context)
    assert result.status == report.FAIL
    assert "context charged less than the driver took for it" in result.summary
    charged = parse.key_values(
        f"allocated={2304 * MIB}\nlast=CUDA_ERROR_OUT_OF_MEMORY\n"
    )  # 9 chunks of 256 MiB
    assert (
        memory.judge_cap("c", CAP, 80 * 1024 * MIB, parse.key_values(INFO), charged, context).status
        == report.PASS
    )


def test_pooled_budget_counts_both_processes() -> None:
    first = parse.key_values(f"allocated={1472 * MIB}\nholding\n")
    second = parse.key_values(f"allocated={1528 * MIB}\nlast=CUDA_ERROR_OUT_OF_MEMORY\nafter_total={CAP}\n")
    result = memory.judge_pooled("p", CAP, first, second, [])
    assert result.status == report.PASS
    assert result.summary.startswith("1472 + 1528 = 3000 MiB of a 3000 MiB cap")
    # Each process alone under the cap, together over it: the budget is not pooled.
    second = parse.key_values(f"allocated={CAP}\nlast=CUDA_ERROR_OUT_OF_MEMORY\n")
    assert memory.judge_pooled("p", CAP, first, second, []).status == report.FAIL


@pytest.mark.parametrize(
    ("family", "output", "status"),
    [
        ("mem", f"allocated={1024 * MIB}\nlast=CUDA_ERROR_OUT_OF_MEMORY\n", report.PASS),
        ("vmm", f"allocated={2048 * MIB}\nlast=CUDA_SUCCESS\nstopped=max\n", report.FAIL),
        ("graph", f"allocated={2048 * MIB}\nlast=CUDA_SUCCESS\nstopped=max\n", report.FAIL),
        ("graph", f"allocated={1024 * MIB}\nlast=cudaErrorMemoryAllocation\n", report.PASS),
        ("pool", "setup_error=CUDA_ERROR_NOT_SUPPORTED\n", report.SKIP),
        ("pool", "setup_error=CUDA_ERROR_INVALID_VALUE\n", report.FAIL),
        ("vmm", "allocated=0\nlast=CUDA_ERROR_NOT_SUPPORTED\n", report.SKIP),
    ],
)
def test_family_verdicts(family: str, output: str, status: str) -> None:
    result = memory.judge_family(
        f"limiter.family.driver.{family}", "what", family, parse.key_values(output), ran(output)
    )
    assert result.status == status, result.summary


SHARED = 1472 * MIB


@pytest.mark.parametrize(
    ("kind", "output", "status"),
    [
        # What the fake driver prints under the limiter: 1472 MiB shared, the second process fills the rest.
        (
            "ipc",
            f"shared={SHARED}\nkcmp=1\nopened=CUDA_SUCCESS\nallocated={CAP - SHARED}\n"
            "last=CUDA_ERROR_OUT_OF_MEMORY\nchild_status=0\n",
            report.PASS,
        ),
        # Charged to both: the second process stops at C less twice the shared memory.
        (
            "ipc",
            f"shared={SHARED}\nkcmp=1\nopened=CUDA_SUCCESS\nallocated={CAP - 2 * SHARED}\n"
            "last=CUDA_ERROR_OUT_OF_MEMORY\nchild_status=0\n",
            report.FAIL,
        ),
        (
            "vmm",
            f"shared={SHARED}\nkcmp=0\nopened=CUDA_SUCCESS\nallocated={CAP - 2 * SHARED}\n"
            "last=CUDA_ERROR_OUT_OF_MEMORY\nchild_status=0\n",
            report.KNOWN,
        ),
        (
            "vmm",
            f"shared={SHARED}\nkcmp=1\nopened=CUDA_SUCCESS\nallocated={CAP}\n"
            "last=CUDA_ERROR_OUT_OF_MEMORY\nchild_status=0\n",
            report.FAIL,
        ),
        ("ipc", f"shared={SHARED}\nkcmp=1\nopened=CUDA_ERROR_OUT_OF_MEMORY\nchild_status=0\n", report.FAIL),
        ("vmm", "setup_error=CUDA_ERROR_NOT_SUPPORTED\n", report.SKIP),
    ],
)
def test_shared_memory_verdicts(kind: str, output: str, status: str) -> None:
    result = memory.judge_shared(f"limiter.shared.{kind}", kind, CAP, parse.key_values(output), True, "")
    assert result.status == status, result.summary


# What the first H100 run recorded (native/limiter/tests/real-gpu/h100-2026-11.json): a bare context took
# 518 MiB, the limiter charged each of two processes about 282 MiB for theirs.
H100_CONTEXT = 518 * MIB


def test_pooled_budget_follows_the_context_rule() -> None:
    first = parse.key_values(f"allocated={1472 * MIB}\nholding\n")
    recorded = parse.key_values(f"allocated={964 * MIB}\nlast=CUDA_ERROR_OUT_OF_MEMORY\n")
    result = memory.judge_pooled("p", CAP, first, recorded, [], H100_CONTEXT)
    assert result.status == report.FAIL, result.summary
    assert "expected 3000 - 2 x 518 MiB context = 1964 MiB" in result.summary
    # Contexts charged what the driver took: 1964 MiB together, the second filling 256 MiB chunks.
    second = parse.key_values(f"allocated={256 * MIB}\nlast=CUDA_ERROR_OUT_OF_MEMORY\n")
    assert memory.judge_pooled("p", CAP, first, second, [], H100_CONTEXT).status == report.PASS


def test_shared_memory_judged_by_the_context_rule() -> None:
    # The real run: shared memory charged once, but the contexts charged less than the driver took.
    out = (
        f"shared={SHARED}\nkcmp=1\nopened=CUDA_SUCCESS\nallocated={964 * MIB}\n"
        "last=CUDA_ERROR_OUT_OF_MEMORY\nchild_status=0\n"
    )
    result = memory.judge_shared(
        "limiter.shared.ipc", "ipc", CAP, parse.key_values(out), True, "", H100_CONTEXT
    )
    assert result.status == report.FAIL
    assert result.summary.startswith("contexts charged less than the driver took")
    # Without the contexts' size it is what it was: charged once, not twice.
    no_ctx = memory.judge_shared("limiter.shared.ipc", "ipc", CAP, parse.key_values(out), True, "")
    assert no_ctx.status == report.PASS, no_ctx.summary
    out = out.replace(f"allocated={964 * MIB}", f"allocated={256 * MIB}")
    ok = memory.judge_shared("limiter.shared.vmm", "vmm", CAP, parse.key_values(out), True, "", H100_CONTEXT)
    assert ok.status == report.PASS, ok.summary


def test_compute_accuracy_within_and_outside_tolerance() -> None:
    ok = compute.judge_accuracy("compute.30pct.short", 30, 0.3105, 3_600_000_000, [ran()])
    assert ok.status == report.PASS
    assert ok.figures["busy_percent"] == pytest.approx(31.05)
    assert "error +1.05 points" in ok.summary
    off = compute.judge_accuracy("compute.30pct.short", 30, 0.40, 3_600_000_000, [ran()])
    assert off.status == report.FAIL
    broken = compute.judge_accuracy(
        "compute.30pct.short", 30, 0.0, 0, [ran(rc=3, stdout="error=cudaErrorNoDevice")]
    )
    assert broken.status == report.FAIL
    assert "no measurement: exit 3: error=cudaErrorNoDevice" in broken.summary
    assert compute.tolerance(10) == 2.0
    assert compute.tolerance(70) == pytest.approx(7.0)


def test_overhead_is_the_ratio_of_medians() -> None:
    result = overhead.judge_overhead("overhead.matmul", [1.0, 1.2, 0.9], [1.02, 5.0, 1.01])
    assert result.figures["ratio"] == pytest.approx(1.02)
    assert result.status == report.PASS
    assert overhead.judge_overhead("o", [1.0], [1.2]).status == report.FAIL


def test_mps_client_verdict_checks_threads_and_pinned_memory() -> None:
    fill = parse.key_values(f"allocated={960 * MIB}\nlast=cudaErrorMemoryAllocation\n")
    # Under MPS the client sees its share of the GPU's 132 SMs and uses all it sees.
    sms = parse.key_values("sms_used=32\nsms=32\nelapsed_ns=8000000\n")
    judge = gpu_settings.judge_mps_client
    assert judge("mps.client-a", 25, 1024 * MIB, fill, sms, [ran()], 132).status == report.PASS
    all_sms = parse.key_values("sms_used=132\nsms=132\n")
    result = judge("mps.client-a", 25, 1024 * MIB, fill, all_sms, [ran()], 132)
    assert result.status == report.FAIL
    assert "132 of the GPU's 132 SMs used at 25 % active threads" in result.summary
    over = parse.key_values(f"allocated={2048 * MIB}\n")
    assert judge("m", 25, 1024 * MIB, over, sms, [ran()], 132).status == report.FAIL
    assert judge("m", 25, 1024 * MIB, fill, sms, [ran()], None).status == report.FAIL


def test_refusals_are_told_apart_from_breakage() -> None:
    assert gpu_settings.refused("`nvidia-smi -c 3` failed with exit code 4: Insufficient Permissions")
    assert gpu_settings.refused("Setting compute mode is not supported for GPU 00000000:17:00.0")
    assert not gpu_settings.refused("`nvidia-smi` did not finish within 30s")


def test_inventory_compare_names_each_difference() -> None:
    rows = parse.smi_csv(
        f"0, {UUID}, 81559, 580.95.05, 9.0, Disabled\n",
        ("index", "uuid", "memory.total", "driver_version", "compute_cap", "mig.mode.current"),
    )
    ours = [
        {
            "index": 0,
            "uuid": UUID,
            "memoryBytes": 81559 * MIB,
            "driverVersion": "580.95.05",
            "cudaComputeCapability": "9.0",
            "cudaDriverVersion": "13.0",
            "migCapable": True,
        }
    ]
    header = "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |"
    assert inventory.compare(ours, rows, header).status == report.PASS
    ours[0].update(memoryBytes=80 * 1024 * MIB, cudaDriverVersion="12.9", migCapable=False)
    result = inventory.compare(ours, rows, header)
    assert result.status == report.FAIL
    assert "GPU 0: memory 81920 MiB vs 81559 MiB" in result.summary
    assert "GPU 0: CUDA version 12.9 vs 13.0" in result.summary
    assert "MIG capable False vs MIG mode Disabled" in result.summary


# -- report, summary, exit status -----------------------------------------------------------------------
def test_summary_shows_failures_with_their_details_and_the_counts() -> None:
    results = [
        report.passed("limiter.cap.driver-api", "total = cap"),
        report.Result(
            "limiter.family.driver.vmm",
            report.FAIL,
            "not enforced: 2048 MiB",
            details=["$ gc_drv family vmm", "  allocated=2147483648"],
        ),
        report.skipped("mps", "nvidia-cuda-mps-control not found"),
        report.Result("limiter.family.driver.graph", report.KNOWN, "graph memory not charged"),
    ]
    text = report.render_summary(results)
    assert "FAIL  limiter.family.driver.vmm" in text
    assert "Failures:\n  limiter.family.driver.vmm: not enforced: 2048 MiB\n    $ gc_drv family vmm" in text
    assert text.endswith("1 passed, 1 failed, 1 skipped, 1 known limits (4 checks)")
    assert report.exit_status(results) == report.EXIT_FAILED
    assert report.exit_status([r for r in results if r.status != report.FAIL]) == report.EXIT_OK
    assert report.exit_status([]) == report.EXIT_OK


def test_report_round_trips_through_its_json_file(tmp_path: Path) -> None:
    rep = report.Report(gpu={"uuid": UUID})
    rep.results = [report.passed("a", "fine", ratio=1.01), report.failed("b", "broken")]
    path = rep.write(tmp_path / "out")
    data = json.loads(path.read_text())
    assert data["counts"] == {"pass": 1, "fail": 1, "skip": 0, "known": 0}
    assert data["exit_status"] == 1
    assert report.load_results(data) == rep.results


def test_a_result_with_an_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown status 'ok'"):
        report.Result("x", "ok")


def test_a_crashing_check_becomes_a_failure_and_the_next_check_still_runs() -> None:
    def crashes(ctx: object) -> report.Result:
        raise KeyError("total")

    results = run_check("limiter.cap", crashes, None)  # type: ignore[arg-type]
    assert [r.status for r in results] == [report.FAIL]
    assert results[0].summary == "the check crashed: KeyError: 'total'"
    assert any("KeyError" in line for line in results[0].details)
    fine = run_check("x", lambda ctx: [report.passed("x.a", ""), report.passed("x.b", "")], None)  # type: ignore[arg-type]
    assert [r.name for r in fine] == ["x.a", "x.b"]


# -- wheels ---------------------------------------------------------------------------------------------
def test_wheels_unpack_into_one_folder_with_data_purelib_merged(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("demo/__init__.py", "VALUE = 1\n")
        zf.writestr("demo-1.0.data/purelib/demo_extra.py", "EXTRA = 2\n")
        zf.writestr("demo-1.0.data/scripts/demo-tool", "#!/bin/sh\n")
        zf.writestr("demo-1.0.dist-info/METADATA", "Name: demo\n")
    site = tmp_path / "site"
    assert bundle.unpack(wheels, site) == ["demo-1.0-py3-none-any.whl"]
    assert (site / "demo/__init__.py").read_text() == "VALUE = 1\n"
    assert (site / "demo_extra.py").is_file()
    assert not (site / "demo-tool").exists() and not (site / "demo-1.0.data").exists()
    (site / "demo/__init__.py").write_text("changed\n")
    bundle.unpack(wheels, site)
    assert (site / "demo/__init__.py").read_text() == "changed\n", "the same wheels are not unpacked twice"
    assert bundle.unpack(tmp_path / "none", tmp_path / "site2") == []


# -- the agent's GPU commands, against a stand-in nvidia-smi ------------------------------------------------
FAKE_SMI = r"""#!/bin/sh
# Keeps the compute mode in $STATE like the driver does; refuses everything when $REFUSE is set.
echo "$*" >> "$STATE.calls"
if [ -n "$REFUSE" ]; then echo "Insufficient Permissions"; exit 4; fi
case "$*" in
  *"-c EXCLUSIVE_PROCESS"*) echo Exclusive_Process > "$STATE" ;;
  *"-c DEFAULT"*) echo Default > "$STATE" ;;
  *"--query-gpu=compute_mode"*) cat "$STATE" 2>/dev/null || echo Default ;;
  *"compute-policy"*"--set-timeslice"*) echo "Set timeslice" ;;
  *"compute-policy"*"-l"*) echo "Timeslice: $(tail -1 "$STATE.calls")" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def smi_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Context:
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(FAKE_SMI)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:/usr/bin:/bin")
    monkeypatch.setenv("STATE", str(tmp_path / "state"))
    gpu = Gpu(0, UUID, "NVIDIA H100 80GB HBM3", 81559 * MIB, "580.95.05")
    return Context(root=ROOT, build=tmp_path, out=tmp_path, gpu=gpu, work=tmp_path)


def test_compute_mode_is_set_read_back_and_restored(smi_context: Context, tmp_path: Path) -> None:
    result = gpu_settings.compute_mode(smi_context)
    assert result.status == report.PASS, result.summary
    assert result.figures == {"before": "Default", "during": "Exclusive_Process", "after": "Default"}
    calls = (tmp_path / "state.calls").read_text().splitlines()
    assert f"-i {UUID} -c EXCLUSIVE_PROCESS" in calls and calls.count(f"-i {UUID} -c DEFAULT") == 1


def test_timeslice_intervals_are_accepted_and_default_comes_last(
    smi_context: Context, tmp_path: Path
) -> None:
    result = gpu_settings.timeslice(smi_context)
    assert result.status == report.PASS, result.summary
    assert result.figures["accepted"] == ["Short", "Medium", "Long", "Default"]
    sets = [c for c in (tmp_path / "state.calls").read_text().splitlines() if "--set-timeslice" in c]
    assert sets[-1] == "compute-policy -i 0 --set-timeslice 0"


def test_a_refusing_driver_is_reported_as_a_skip_quoting_it(
    smi_context: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REFUSE", "1")
    result = gpu_settings.compute_mode(smi_context)
    assert result.status == report.SKIP
    assert result.summary.startswith("the driver refused setting EXCLUSIVE_PROCESS:")
    assert "Insufficient Permissions" in result.summary
    assert gpu_settings.timeslice(smi_context).status == report.SKIP


def test_wheels_for_another_python_are_named() -> None:
    wheels = [
        "grpcio-1.85.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl",
        "pydantic-2.14.3-py3-none-any.whl",
    ]
    assert bundle.foreign(wheels, (3, 12)) == []
    assert bundle.foreign(wheels, (3, 11)) == [wheels[0]]


def test_the_bundle_is_what_the_node_path_needs_less_what_the_node_has() -> None:
    pinned = {p.split("==")[0] for p in bundle.closure()}
    assert {"pydantic", "pydantic-core", "grpcio", "protobuf", "common-expression-language"} <= pinned
    assert not pinned & {"jinja2", "pyyaml", "prometheus-client", "nvidia-ml-py"}, "the node has those"
    assert "kubernetes" not in pinned, "imported only when talking to a real API server"


FAKE_MPS_CONTROL = r"""#!/bin/sh
# Stands in for nvidia-cuda-mps-control: `-d` starts a daemon (a file in the pipe directory), the
# control client answers while it runs; a client's program creates the server.
echo "$* $(cat 2>/dev/null | tr '\n' ' ')" >> "$STATE.mps"
dir="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then touch "$dir/daemon"; exit 0; fi
[ -e "$dir/daemon" ] || exit 1
case "$(tail -1 "$STATE.mps")" in
  *get_server_list*) [ -e "$dir/server" ] && echo 4242 ;;
  *quit*) rm -f "$dir/daemon" "$dir/server" ;;
esac
exit 0
"""
FAKE_CLIENT = r"""#!/bin/sh
# A CUDA program: outside MPS (`info`) it sees the GPU's 132 SMs; under MPS it finds the GPU's /dev/shm
# (mounted by the check) and the daemon, and sees only its share of the SMs (whole TPCs of 2), as on an H100.
[ "$1" = info ] && [ -z "$CUDA_MPS_PIPE_DIRECTORY" ] && { echo "sms=132"; exit 0; }
[ -e "$CUDA_MPS_PIPE_DIRECTORY/daemon" ] || { echo "error=cudaErrorMpsConnectionFailed"; exit 3; }
touch "$CUDA_MPS_PIPE_DIRECTORY/server"
mib=${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT#0=}; mib=${mib%M}
pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
case "$1" in
  family) echo "allocated=$(( (mib - 64) * 1048576 ))"; echo "last=cudaErrorMemoryAllocation"
          if [ "$5" = "--hold" ]; then echo holding; cat >/dev/null; fi ;;
  info) echo "sms=132" ;;
  sms) share=$(( 132 * pct / 100 / 2 * 2 )); echo "sms_used=$share"; echo "sms=$share" ;;
esac
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_mps_is_started_as_the_agent_does_each_client_checked_and_stopped(
    smi_context: Context, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    (bin_dir / "nvidia-cuda-mps-control").write_text(FAKE_MPS_CONTROL)
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    client = bin_dir / "client"
    client.write_text(FAKE_CLIENT)
    client.chmod(0o755)
    smi_context.programs["gc_rt_shared"] = client
    results = {r.name: r for r in gpu_settings.mps(smi_context)}
    assert [r.status for r in results.values()] == [report.PASS] * 5, [r.summary for r in results.values()]
    assert list(results) == ["mps.start", "mps.server", "mps.client-a", "mps.client-b", "mps.stop"]
    assert results["mps.start"].summary.endswith("compute mode Exclusive_Process")
    assert results["mps.client-a"].figures["sms_used"] == 32
    assert results["mps.client-a"].figures["gpu_sms"] == 132
    assert results["mps.server"].summary == "the daemon lists server PID 4242 while a client runs"
    assert results["mps.client-b"].figures["allocated"] == (2048 - 64) * MIB
    assert results["mps.stop"].figures["compute_mode"] == "Default"
    assert "quit" in (tmp_path / "state.mps").read_text()


FAKE_BUSY = r"""#!/usr/bin/env python3
# Stands in for `gc_rt busy ... --ready --out FILE`: busy for DRAGPU_CORES_LIMIT % of a 2 s window
# (100 % without it), in kernels of 50 us (--graph N: N kernels in a row); a second process of the
# claim takes turns with the first.
import os, struct, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
print("ready", flush=True)
sys.stdin.read(1)
share = int(os.environ.get("DRAGPU_CORES_LIMIT", "100")) / 100
index = int(out.rsplit("-", 1)[1].split(".")[0])
period = 1_000_000  # 1 ms periods; in each, the claim's processes run one after the other
with open(out, "wb") as f:
    for p in range(2000):
        start = p * period + index * int(share * period / 2)
        length = int(share * period / 2) if "two" in out else int(share * period)
        if index == 0 or "two" in out:  # a graph's nodes split the period's share; a tenth is bookkeeping
            nodes = int(args[args.index("--graph") + 1]) if "--graph" in args else 1
            for k in range(nodes):
                s, e = start + length * k // nodes, start + length * (k + 1) // nodes
                f.write(struct.pack("<QQQ", s, s + (e - s) * 9 // 10, e))
print("launches=2000")
"""


def test_compute_accuracy_runs_the_processes_of_a_claim_together_and_unions_their_kernels(
    smi_context: Context, tmp_path: Path
) -> None:
    busy = tmp_path / "bin" / "busy"
    busy.write_text(FAKE_BUSY)
    busy.chmod(0o755)
    smi_context.programs["gc_rt_shared"] = busy
    smi_context.limiter = tmp_path / "libdragpu-limiter.so.1"
    smi_context.quick = True
    assert compute.baseline(smi_context).status == report.PASS
    results = {r.name: r for r in compute.accuracy(smi_context)}
    assert len(results) == 20
    assert all(r.status == report.PASS for r in results.values()), [r.summary for r in results.values()]
    assert results["compute.30pct.two-processes"].figures["busy_percent"] == pytest.approx(30.0, abs=0.1)
    assert results["compute.30pct.short"].figures["spin_busy_percent"] == pytest.approx(27.0, abs=0.1)
    assert results["compute.30pct.short"].figures["bookkeeping_ns"] == 30_000
    assert results["compute.70pct.graph"].figures["target"] == 70


def test_overhead_interleaves_runs_with_and_without_the_preload(smi_context: Context, tmp_path: Path) -> None:
    python = tmp_path / "bin" / "python"
    # A run with a compute share takes 1.09 s for its train steps: past 1.05 x 100/99, a throttled path that costs.
    python.write_text(
        '#!/bin/sh\nif [ -n "$LD_PRELOAD" ]; then t=1.02; else t=1.00; fi\n'
        'if [ -n "$DRAGPU_CORES_LIMIT" ]; then train=1.09; t=1.06; else train=$t; fi\n'
        'echo "preload=${LD_PRELOAD:-none} cores=${DRAGPU_CORES_LIMIT:-none}" >> "$STATE.runs"\n'
        "echo matmul_seconds=$t; echo train_seconds=$train; echo graph_seconds=1.5\n"
        'if [ -n "$DRAGPU_CORES_LIMIT" ]; then first=0.25; else first=0.2; fi\n'
        "echo train_first_step_seconds=$first\n"
    )
    python.chmod(0o755)
    smi_context.python = str(python)
    smi_context.limiter = tmp_path / "libdragpu-limiter.so.1"
    results = {r.name: r for r in overhead.overhead(smi_context)}
    assert results["overhead.matmul"].figures["ratio"] == pytest.approx(1.02)
    assert results["overhead.graph"].figures["ratio"] == pytest.approx(1.0)
    assert results["overhead.matmul.throttled"].figures["ratio"] == pytest.approx(1.06)
    assert results["overhead.matmul.throttled"].status == report.PASS  # within 1.05 x 100 / 99
    assert results["overhead.train.throttled"].status == report.FAIL
    assert "and a 99 % compute share / without: 1.0900" in results["overhead.train.throttled"].summary
    assert all(r.status == report.PASS for n, r in results.items() if n != "overhead.train.throttled")
    # The first step's time (every kind of launch new to the limiter) is reported, not judged.
    assert results["overhead.train.throttled"].figures["first_step_ms"] == pytest.approx(250.0)
    assert results["overhead.train.throttled"].figures["first_step_ms_bare"] == pytest.approx(200.0)
    assert results["overhead.train"].figures["first_step_ms"] == pytest.approx(200.0)
    assert "first_step_ms" not in results["overhead.matmul"].figures
    runs = (tmp_path / "state.runs").read_text().splitlines()
    bare, preload, throttled = (
        "preload=none cores=none",
        f"preload={smi_context.limiter} cores=none",
        f"preload={smi_context.limiter} cores=99",
    )
    assert runs[:6] == [bare, preload, throttled, preload, throttled, bare]  # each kind first in turn
    assert len(runs) == 3 * overhead.ROUNDS


def test_nvml_utilization_leaves_out_the_edges_and_is_absent_without_samples() -> None:
    sampler = UtilizationSampler(UUID)
    sampler.samples = [0, 100, 100, 30, 30, 30, 100, 100, 0]
    assert sampler.mean(skip=3) == 30
    sampler.samples = [30, 30]
    assert sampler.mean() is None
