"""`dra-gpu demo` runs end to end on this machine and its summary says who holds which share."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from fake_driver import CONTEXT_CHARGE, usable

from dra_gpu.cli import main
from dra_gpu.demo.elastic_step import why_not_run
from dra_gpu.demo.run import DemoReport, run_demo
from dra_gpu.quantity import format_quantity


@pytest.fixture(scope="module")
def demo(request: pytest.FixtureRequest) -> tuple[DemoReport, str]:
    """The demo as `make demo` runs it: with the limiter built (`built`), unless there is no C toolchain."""
    try:
        build: Path | None = request.getfixturevalue("built")
    except pytest.skip.Exception:
        build = None  # its limiter steps then say they were skipped; the limiter's tests skip with `built`
    stream = io.StringIO()
    report = run_demo(stream, limiter_build=build)
    return report, stream.getvalue()


def holders(report: DemoReport) -> dict[str, tuple[str, str, str, list[str], str]]:
    """claim -> (gpu, mode, share, pods, allocated by)."""
    return {
        h.claim: (g.device, h.strategy, h.share, h.pods, h.allocated_by)
        for g in report.gpus
        for h in g.holders
    }


def test_every_mode_ends_on_the_gpu_that_serves_it(demo: tuple[DemoReport, str]) -> None:
    report, _ = demo
    held = holders(report)
    sharing = {g.device: g.sharing for g in report.gpus}
    assert (
        held["whole-gpu"][1:3] == ("Exclusive", "whole GPU") and sharing[held["whole-gpu"][0]] == "Exclusive"
    )
    assert held["limited"][1:4] == ("Limiter", "10Gi memory, 30 cores", ["inference"])
    assert held["mps-share"][1] == "MPS" and sharing[held["mps-share"][0]] == "MPS"
    assert held["time-sliced"][1] == "TimeSlicing" and sharing[held["time-sliced"][0]] == "Shared"
    assert held["team-share"][3] == ["team-0", "team-1", "team-2"]  # one claim, three pods
    assert not report.prepare_errors


def test_the_anti_affinity_claims_wait_for_the_controller_and_land_apart(
    demo: tuple[DemoReport, str],
) -> None:
    report, _ = demo
    assert set(report.first_round_pending) == {"web-0", "web-1"}
    assert "cannot allocate all claims" in report.first_round_pending["web-0"]
    held = holders(report)
    assert held["web-0"][4] == held["web-1"][4] == "controller"
    assert held["web-0"][0] != held["web-1"][0]
    assert set(report.controller_allocated) == {"demo/web-0", "demo/web-1"}
    assert report.bound["web-0"] == report.bound["web-1"] == "demo-node"


def test_the_summary_is_readable_and_names_what_is_simulated(demo: tuple[DemoReport, str]) -> None:
    report, text = demo
    for part in ("Kubernetes API server", "GPUs", "kube-scheduler", "kubelet", "nvidia-smi", "CUDA driver"):
        assert re.search(rf"^\s+{re.escape(part)}[\s,]", text, re.M), part
    gpu = holders(report)["limited"][0]
    block = text.split(f"\n{gpu}  ")[1].split("\n\n")[0]
    assert re.search(r"limited\s+Limiter\s+10Gi memory, 30 cores\s+inference\s+scheduler", block)
    assert re.search(r"team-share\s+Limiter\s+16Gi memory, 40 cores\s+team-0, team-1, team-2", block)
    assert "pods team-0, team-1, team-2 (claims: team-share)" in text
    assert re.search(r"DRAGPU_MEMORY_LIMIT_BY_UUID=GPU-[0-9a-f-]+=10737418240", text), text
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in text
    assert any(c.startswith("start_mps_daemon") for c in report.gpu_commands)


def test_the_mig_step_makes_a_3g_instance_and_shares_a_static_1g_between_two_limiter_claims(
    demo: tuple[DemoReport, str],
) -> None:
    report, text = demo
    mig = report.mig
    assert mig is not None and mig.errors == {}
    assert (mig.counter_set, mig.placements, len(mig.static)) == ("gpu-0-mig", 25, 7)
    held = {h.claim: h for h in mig.holders}
    big, a, b = held["mig-3g"], held["mig-small-a"], held["mig-small-b"]
    assert big.device.startswith("gpu-0-mig-3g40gb-") and big.mig_uuid.startswith("MIG-")
    assert big.limit == "" and len(big.caps) == 2
    (made,) = mig.made
    assert made.startswith("create_mig_instance ") and made.endswith(
        f" 3g.40gb {big.device.rsplit('-', 1)[1]}"
    )
    assert a.device == b.device == "gpu-1-mig-1g10gb-0" and a.mig_uuid == b.mig_uuid
    for share in (a, b):  # each claim's limiter file names the instance, not its parent GPU
        assert share.limit == f"device={a.mig_uuid} memory={4 * 2**30} cores=50"
        assert share.caps == a.caps and len(a.caps) == 2 and a.caps != big.caps
    assert mig.left_after_unprepare == []
    section = text.split("MIG: a dynamic and a static H100")[1].split("\n== ")[0]
    assert re.search(r"mig-small-a\s+mig-infer-a\s+gpu-1-mig-1g10gb-0\s+MIG-", section)
    assert "4Gi, 50 % of MIG-" in section and "/dev/nvidia-caps/nvidia-cap" in section
    assert "1 instance destroyed on the dynamic GPU, 0 left" in section


def test_the_demo_cleans_up(demo: tuple[DemoReport, str]) -> None:
    report, text = demo
    assert "CDI specs left after unprepare: 0" in text
    assert report.workdir is not None and not report.workdir.exists()


@pytest.mark.usefixtures("built")  # builds the limiter; fails if it does not build
def test_the_limiter_refuses_an_allocation_over_the_cap(demo: tuple[DemoReport, str]) -> None:
    report, text = demo
    assert report.limiter is not None and report.limiter.ran
    assert report.limiter.reported_total == 10 * 2**30
    # The 10Gi cap holds the process's CUDA context too: what is left takes whole 1Gi chunks.
    assert report.limiter.reported_free == 10 * 2**30 - CONTEXT_CHARGE
    chunks = usable(10 * 2**30) // 2**30
    assert report.limiter.granted_chunks == chunks
    assert report.limiter.refused_at == chunks + 1
    assert report.limiter.refused_error == "CUDA_ERROR_OUT_OF_MEMORY"
    assert f"allocation {chunks + 1}: CUDA_ERROR_OUT_OF_MEMORY" in text
    assert f"of which its own CUDA context already holds {format_quantity(CONTEXT_CHARGE)}" in text


def test_the_elastic_step_borrows_idle_time_and_gives_it_back_when_the_other_claim_wakes(
    demo: tuple[DemoReport, str], built: Path
) -> None:
    if why_not_run(built):
        pytest.skip(why_not_run(built))  # no user namespaces here; a build that failed fails `built`
    report, text = demo
    elastic = report.elastic
    assert elastic is not None and elastic.ran and not elastic.errors, elastic
    # Each time step as (steady borrowed, bursty working): the order of what happened, not when.
    states = [(s.borrowed["steady"] > 10, s.used["bursty"] > 10) for s in elastic.samples]
    woke = states.index((False, True))  # bursty works and steady borrows nothing: it gave the time back
    assert (True, False) in states[:woke], states  # before: steady borrowed what bursty left idle
    slept = max(i for i, (_, working) in enumerate(states) if working)
    assert (True, False) in states[slept + 1 :], states  # after: it borrows again
    # While bursty works (the step it stops in may hold some of both), steady borrows nothing.
    assert not any(borrowed and working for borrowed, working in states[woke:slept]), states
    assert max(s.used["bursty"] for s in elastic.samples) >= 50  # bursty got its floor back (70 %)
    (_, steady_borrowed, _), (_, bursty_borrowed, bursty_lent) = (
        elastic.totals["steady"],
        elastic.totals["bursty"],
    )
    assert steady_borrowed > 0 and bursty_borrowed == 0 and bursty_lent > 0  # what the agent's /metrics say
    section = text.split("Elastic compute: one limiter claim")[1].split("\n== ")[0]
    assert re.search(r"\|#+\++ *\|", section)  # a bar with borrowed time
    assert re.search(
        r"demo/bursty .*floor 70% ceiling 70% standard: [\d.]+ s used, 0.0 s borrowed, [\d.]+ s lent", section
    )


def test_without_the_limiter_built_the_step_is_skipped_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--limiter-build", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.count("skipped: the native limiter is not built here") == 2  # the cap and the elastic steps
    assert "pods team-0, team-1, team-2" in text


def test_a_missing_limiter_build_directory_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--limiter-build", "/nonexistent/build"]) == 2
    assert "--limiter-build /nonexistent/build: not a directory" in capsys.readouterr().err


def test_the_elastic_step_says_why_it_cannot_run_without_unshare(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no unshare on it
    assert why_not_run(built).startswith("cannot start a process in a mount namespace of its own (unshare: ")
    assert why_not_run(tmp_path).startswith("the native limiter is not built here")
