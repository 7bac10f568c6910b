"""The Python mirror of the limiter's region reads what the real library writes (drift fails here)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from fake_driver import CONTEXT_CHARGE, usable
from limiter_env import limiter_env
from repo_paths import ROOT

from dra_gpu.limiter_abi.region import REGION_BYTES, REGION_FILE, read_region
from dra_gpu.plugin.sharing.steps.device_access import device_uuids

LIMITER = ROOT / "native" / "limiter"
BUILD = LIMITER / "build"
MiB = 2**20
GiB = 2**30
UUID = "GPU-11111111-2222-3333-4444-555555555555"
LIMIT = GiB + 2 * CONTEXT_CHARGE  # 1 GiB to allocate besides two processes' contexts


def _probe(built: Path, state: Path, *args: str) -> subprocess.Popen[str]:
    env = limiter_env(
        built,
        DRAGPU_LIMITER_STATE_DIR=str(state),
        DRAGPU_MEMORY_LIMIT_BY_UUID=f"{UUID}={LIMIT}",
        CUDA_VISIBLE_DEVICES=UUID,
    )
    return subprocess.Popen([str(built / "limiter-probe"), *args], env=env, stdout=subprocess.PIPE, text=True)


def test_region_written_by_the_library_reads_back(built: Path, tmp_path: Path) -> None:
    assert read_region(tmp_path) is None, "no region before the first limited process"
    holder = _probe(built, tmp_path, "alloc", str(768 * MiB), "1", "--hold")
    try:
        assert holder.stdout is not None
        lines = [holder.stdout.readline().strip() for _ in range(3)]
        assert lines[-1] == "holding", lines
        assert (tmp_path / REGION_FILE).stat().st_size == REGION_BYTES
        refused = _probe(built, tmp_path, "alloc", str(512 * MiB), "1")
        out, _ = refused.communicate(timeout=60)
        assert out.splitlines()[-1] == "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY"
        devices = read_region(tmp_path)
        assert devices is not None and len(devices) == 1
        (device,) = devices
        assert device.uuid.lower() == UUID.lower()
        assert device.used_bytes == 768 * MiB + CONTEXT_CHARGE  # the holder's allocation and context
        assert device.refused == 1
        assert device.throttled_seconds == 0.0
    finally:
        holder.kill()
        holder.wait()
    (after,) = read_region(tmp_path) or []
    assert after.used_bytes == 0, "a dead process's bytes are not reported, though no sweep has run yet"


def test_memory_a_process_shares_is_reported_once_while_it_lives(built: Path, tmp_path: Path) -> None:
    """Exported memory's charge lives in the region's export table, not the exporter's slot."""
    holder = _probe(built, tmp_path, "alloc", str(256 * MiB), "3", "--export", "--hold")
    try:
        assert holder.stdout is not None
        lines = [holder.stdout.readline().strip() for _ in range(6)]
        assert lines[-2:] == ["exported=3", "holding"], lines
        (device,) = read_region(tmp_path) or []
        assert device.used_bytes == 768 * MiB + CONTEXT_CHARGE
    finally:
        holder.kill()
        holder.wait()
    (after,) = read_region(tmp_path) or []
    assert after.used_bytes == 0, "memory no live process holds is not reported"


def test_a_region_of_another_layout_is_skipped(tmp_path: Path) -> None:
    (tmp_path / REGION_FILE).write_bytes(b"\0" * REGION_BYTES)
    assert read_region(tmp_path) is None


def test_throttled_and_measured_time_are_counted_for_the_claim(built: Path, tmp_path: Path) -> None:
    compute = built / "tests" / "t_compute"
    result = subprocess.run(
        ["make", "-C", str(LIMITER), "build/tests/t_compute"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    env = limiter_env(
        built,
        DRAGPU_LIMITER_STATE_DIR=str(tmp_path),
        DRAGPU_CORES_LIMIT="30",
        FAKE_CUDA_SM_COUNT="132",
        FAKE_CUDA_WAVE_NS="10000",
    )
    env["T_COMPUTE_VERBOSE"] = "1"
    # The accuracy of the cap is the native suite's business; here that the region carries the figures.
    run = subprocess.run(
        [str(compute), "30", "0.5"], env=env, capture_output=True, text=True, check=False, timeout=120
    )
    found = re.search(r"device busy in all ([\d.]+) s", run.stderr)
    assert found, run.stdout + run.stderr
    devices = read_region(tmp_path)
    assert devices is not None and len(devices) == 1
    assert devices[0].throttled_seconds > 0, "a throttled claim's waiting time is in the region"
    # Every launch counts, not only those the limiter timed (one in eight of a kind once its times agree):
    # measured ones at their time, the others at their estimate; the last few measurements may be unread.
    assert devices[0].busy_seconds == pytest.approx(float(found.group(1)), rel=0.1)
    assert devices[0].refused == 0


def _scrape(port: int | None) -> dict[tuple[str, str | None], tuple[dict[str, str], float]]:
    assert port is not None, "the agent serves no HTTP endpoint"
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, s.labels.get("claim")): (s.labels, s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_metrics_of_a_limiter_claim_equal_its_region(built: Path, tmp_path: Path) -> None:
    """Simulated GPUs (no NVML): memory in use and refusals on /metrics come from the claim's region."""

    from plugin_harness import (
        PluginDirs,
        claim_process_env,
        monitor_of,
        prepared_container,
        running_plugin,
        share_claim,
    )

    from dra_gpu.kube.fake import FakeKube

    dirs = PluginDirs.create()
    api = FakeKube()
    claim = share_claim(api, "batch", device="gpu-1", memory="2Gi", cores="50", share=10, namespace="team-a")
    try:
        with (
            running_plugin(dirs, api, http_address="127.0.0.1:0") as plugin,
            prepared_container(dirs, claim) as container,
        ):
            env = claim_process_env(built, container)
            workload = subprocess.Popen(
                [str(built / "limiter-probe"), "alloc", str(384 * MiB), "0", "--hold"],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert workload.stdout is not None
                fits = usable(2 * GiB) // (384 * MiB)  # allocations of 384 MiB beside the process's context
                lines = [workload.stdout.readline().strip() for _ in range(fits + 3)]
                allocated = fits * 384 * MiB
                assert lines[-2:] == [f"allocated={allocated} last=CUDA_ERROR_OUT_OF_MEMORY", "holding"], (
                    lines
                )
                monitor_of(plugin).sample_once()
                values = _scrape(plugin.http_port)
                labels, used = values[("dra_gpu_claim_memory_used_bytes", "batch")]
                assert used == allocated + CONTEXT_CHARGE
                assert labels == {
                    "namespace": "team-a",
                    "claim": "batch",
                    "gpu_uuid": ",".join(device_uuids(container.env)),
                }
                assert values[("dra_gpu_claim_allocations_refused_total", "batch")][1] == 1
                limit_labels, limit = values[("dra_gpu_claim_memory_limit_bytes", "batch")]
                assert limit == 2 * GiB
                assert limit_labels == {**labels, "sharing": "Limiter"}, "the limit names the sharing mode"
            finally:
                workload.kill()
                workload.wait()
            # Killed: the region still counts its bytes until the claim's next process sweeps, the agent not.
            monitor_of(plugin).sample_once()
            assert _scrape(plugin.http_port)[("dra_gpu_claim_memory_used_bytes", "batch")][1] == 0
    finally:
        dirs.cleanup()
