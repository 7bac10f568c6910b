"""Elastic compute, seen: the GPU time each limiter claim reports using, borrowing and being held, and what it
lent, as /metrics serves them (each once it counts) and as the ledger works lent time out; the agent's
floor, ceiling and class of each claim as the ledger reads them from the board."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from monitor_harness import add_pod, fake_proc, plugin_with_nvml
from plugin_harness import (
    Alloc,
    Kubelet,
    PluginDirs,
    add_claim,
    class_grant,
    gpu_config,
    monitor_of,
    opaque,
    uid_of,
)
from test_monitor import scrape

from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi import board
from dra_gpu.monitor.elastic import ElasticLedger

S = 1_000_000_000


def report(path: Path, used_s: float, borrowed_s: float, waiting: int = 0, held_s: float = 0.0) -> None:
    """What the library writes into a claim's activity file (offsets of the contract)."""
    with open(path, "r+b") as f:
        f.seek(24)
        f.write(struct.pack("<QQQQ", int(used_s * S), int(borrowed_s * S), waiting, int(held_s * S)))


def share(api: FakeKube, name: str, cores: int, n: int, compute: dict[str, Any]) -> dict[str, Any]:
    return add_claim(
        api,
        name,
        [
            Alloc(
                share_id=f"00000000-0000-4000-8000-{n:012d}", consumed={"memory": "4Gi", "cores": str(cores)}
            )
        ],
        [
            class_grant(compute),
            opaque(gpu_config("Limiter", limiter={"compute": compute}), source="FromClaim"),
        ],
    )


def test_metrics_show_what_each_claim_reports_once_it_counts_and_not_its_configuration(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    api = FakeKube()
    inference = share(api, "inference", 30, 1, {"limit": 100, "priority": "latency"})
    training = share(api, "training", 20, 2, {"limit": 100, "priority": "besteffort"})
    with plugin_with_nvml(dirs, api, tmp_path / "proc") as (plugin, driver):
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert [a.error for a in kubelet.prepare(inference, training).values()] == ["", ""]
        gpu = driver.gpus[0].uuid
        directory = dirs.state_dir / "gpus" / gpu
        report(directory / f"{uid_of(inference)}.activity", used_s=12.5, borrowed_s=0.0, held_s=0.0)
        report(
            directory / f"{uid_of(training)}.activity", used_s=40.0, borrowed_s=31.0, waiting=3, held_s=2.0
        )
        monitor_of(plugin).sample_once()

        metrics = scrape(plugin.http_port)
        labels = {
            name: {"namespace": "default", "claim": name, "gpu_uuid": gpu}
            for name in ("inference", "training")
        }
        for configuration in ("floor_ratio", "ceiling_ratio", "priority"):
            assert f"dra_gpu_claim_compute_{configuration}" not in metrics, (
                "the claim's config is not a series"
            )
        assert sorted(metrics["dra_gpu_claim_compute_used_seconds_total"], key=str) == sorted(
            [(labels["inference"], 12.5), (labels["training"], 40.0)], key=str
        )
        # Inference borrowed nothing and was never held: it has no such series (0 s) until it does.
        assert metrics["dra_gpu_claim_compute_borrowed_seconds_total"] == [(labels["training"], 31.0)]
        assert metrics["dra_gpu_claim_compute_held_seconds_total"] == [(labels["training"], 2.0)]
        assert "dra_gpu_claim_compute_lent_seconds_total" not in metrics, "nothing lent before an interval"

        # Over the next interval training keeps borrowing and inference runs nothing: inference lends.
        report(
            directory / f"{uid_of(training)}.activity", used_s=50.0, borrowed_s=41.0, waiting=3, held_s=2.0
        )
        monitor_of(plugin).sample_once()
        lent = scrape(plugin.http_port)["dra_gpu_claim_compute_lent_seconds_total"]
        assert [lab["claim"] for lab, value in lent if value > 0] == ["inference"]

        assert kubelet.unprepare(training)[uid_of(training)] == ""
        monitor_of(plugin).sample_once()
        metrics = scrape(plugin.http_port)
        assert [lab["claim"] for lab, _ in metrics["dra_gpu_claim_compute_used_seconds_total"]] == [
            "inference"
        ]
        kubelet.close()


@pytest.fixture
def gpu_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "gpus" / "GPU-0"
    directory.mkdir(parents=True)
    board.make_board(directory / "board")
    board.write_board(
        directory / "board",
        [board.Entry("serve", 30, 100, "latency"), board.Entry("train", 20, 100, "besteffort")],
    )
    for uid in ("serve", "train"):
        board.make_activity(directory / f"{uid}.activity")
    return directory


def test_time_borrowed_is_lent_by_the_claim_that_left_its_floor_idle(gpu_dir: Path) -> None:
    ledger = ElasticLedger(gpu_dir.parent)
    claims = [("serve", "GPU-0"), ("train", "GPU-0")]
    ledger.sample(claims, now_s=100.0)
    # Over 10 s the service used 1 s (its floor is 3 s) and training 9 s, 7 s of it borrowed.
    report(gpu_dir / "serve.activity", used_s=1.0, borrowed_s=0.0)
    report(gpu_dir / "train.activity", used_s=9.0, borrowed_s=7.0)
    figures = ledger.sample(claims, now_s=110.0)
    assert figures[("serve", "GPU-0")].lent_seconds == pytest.approx(2.0), "all it left idle of its floor"
    assert figures[("train", "GPU-0")].lent_seconds == 0.0
    assert (figures[("train", "GPU-0")].used_seconds, figures[("train", "GPU-0")].borrowed_seconds) == (
        9.0,
        7.0,
    )
    # The next 10 s the service is busy at its floor: it lends nothing more.
    report(gpu_dir / "serve.activity", used_s=4.0, borrowed_s=0.0)
    report(gpu_dir / "train.activity", used_s=16.0, borrowed_s=12.0)
    figures = ledger.sample(claims, now_s=120.0)
    assert figures[("serve", "GPU-0")].lent_seconds == pytest.approx(2.0)


def test_a_claim_that_reports_absurd_borrowing_cannot_make_another_lend_more_than_its_floor(
    gpu_dir: Path,
) -> None:
    ledger = ElasticLedger(gpu_dir.parent)
    claims = [("serve", "GPU-0"), ("train", "GPU-0")]
    ledger.sample(claims, now_s=0.0)
    report(gpu_dir / "train.activity", used_s=10_000.0, borrowed_s=10_000.0)
    figures = ledger.sample(claims, now_s=10.0)
    assert figures[("serve", "GPU-0")].lent_seconds == pytest.approx(3.0), "30 % of 10 s at most"


def test_a_damaged_activity_file_reports_nothing_and_the_board_still_shows_the_share(gpu_dir: Path) -> None:
    (gpu_dir / "train.activity").write_bytes(b"FORGED!!" + bytes(4088))
    figures = ElasticLedger(gpu_dir.parent).sample([("train", "GPU-0")], now_s=0.0)
    train = figures[("train", "GPU-0")]
    assert (train.floor, train.ceiling, train.priority) == (20, 100, "besteffort")
    assert train.used_seconds is None and train.borrowed_seconds is None


def test_a_claim_that_says_it_is_busy_while_the_driver_sees_it_idle_is_caught(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    """The claim's activity file says it wants the GPU for the next minute; NVML says its process ran nothing:
    the node marks it on its GPU's board (a flag the library reads and the claim cannot write) and tells the
    claim, until the driver sees it run."""
    api = FakeKube()
    claim = share(api, "loud", 30, 1, {})
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        with plugin_with_nvml(dirs, api, tmp_path / "proc") as (plugin, driver):
            kubelet = Kubelet(dirs.registration_dir)
            kubelet.register()
            assert not kubelet.prepare(claim)[uid_of(claim)].error
            gpu = driver.gpus[0].uuid
            pod_uid, cid = add_pod(api, "loud-pod", ["loud"])
            fake_proc(tmp_path / "proc", child.pid, pod_uid, cid, limiter=True)
            driver.gpus[0].processes = {child.pid: 2**30}
            activity = dirs.state_dir / board.GPUS_DIR / gpu / board.activity_name(uid_of(claim))
            with open(activity, "r+b") as f:
                f.seek(16)
                f.write(struct.pack("<q", time.monotonic_ns() + 60 * S))
            monitor = monitor_of(plugin)
            driver.gpus[0].utilization = [(child.pid, 1_000_000, 0, 0)]
            monitor.sample_once()
            driver.gpus[0].utilization.append((child.pid, 2_000_000, 0, 0))
            monitor.sample_once()
            assert monitor.idle_by_driver() == {(uid_of(claim), gpu)}
            path = dirs.state_dir / board.GPUS_DIR / gpu / board.BOARD_FILE
            assert board.read_marks(path) == {uid_of(claim)}, "the library reads the mark on the board"
            assert [e.claim_uid for e in board.read_board(path)] == [uid_of(claim)], "its entry stays"
            said = [e for e in api.objects("Event") if e["reason"] == "ActivityContradicted"]
            assert len(said) == 1 and said[0]["involvedObject"]["name"] == "loud"
            driver.gpus[0].utilization.append((child.pid, 3_000_000, 60, 0))  # it runs: its word stands
            monitor.sample_once()
            assert monitor.idle_by_driver() == set()
            assert board.read_marks(path) == set(), "the mark goes when the driver sees the claim run"
            kubelet.close()
    finally:
        child.kill()
        child.wait()
