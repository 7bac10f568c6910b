"""Cleanup always makes progress: a rollback that fails keeps its record for a later call, the sweep goes on
past a record it cannot undo (and says so in a metric and a warning), temporary files of interrupted writes
never keep a claim's directory alive, and a file system error names the file and the errno in words."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from plugin_harness import (
    Kubelet,
    PluginDirs,
    running_plugin,
    share_claim,
    uid_of,
)

from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.checkpoint import ClaimState


def limiter_claim(api: FakeKube, name: str, n: int, device: str = "gpu-0") -> dict[str, Any]:
    return share_claim(api, name, device=device, share=n, cores="5")


def spec_path(dirs: PluginDirs, claim: dict[str, Any]) -> Path:
    return dirs.cdi_dir / f"gpu.dra-gpu.io-claim_{uid_of(claim)}.json"


def block(path: Path) -> None:
    """Put a non-empty directory where the agent writes or removes a file: both fail with EISDIR."""
    path.unlink(missing_ok=True)
    path.mkdir()
    (path / "in-the-way").write_text("")


def unblock(path: Path) -> None:
    (path / "in-the-way").unlink()
    path.rmdir()


def sample(plugin: Any, name: str, **labels: str) -> float | None:
    return plugin.plugin.metrics.registry.get_sample_value(name, labels)


def test_a_failed_rollback_keeps_the_record_and_the_next_call_retries_it(
    dirs: PluginDirs, api: FakeKube, kubelet: Kubelet
) -> None:
    claim = limiter_claim(api, "c", 1)
    with running_plugin(dirs, api) as plugin:
        kubelet.register()
        block(spec_path(dirs, claim))  # the spec cannot be written, nor removed by the rollback
        error = kubelet.prepare(claim)[uid_of(claim)].error
        assert f"{spec_path(dirs, claim)}: Is a directory (EISDIR)" in error, error
        assert "internal error" not in error and "OSError(" not in error
        record = dirs.checkpoint().claims[uid_of(claim)]
        assert record.state == ClaimState.PREPARE_STARTED, "the record stays: the undo is retried"
        assert sample(plugin, "dra_gpu_claim_errors_total", operation="rollback", reason="filesystem") == 1

        unblock(spec_path(dirs, claim))
        answer = kubelet.prepare(claim)[uid_of(claim)]
        assert answer.error == "" and answer.devices
        assert dirs.checkpoint().claims[uid_of(claim)].state == ClaimState.PREPARE_COMPLETED
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
    assert dirs.spec_files() == [] and dirs.claim_dirs() == [] and dirs.checkpoint().claims == {}


def test_the_sweep_goes_past_a_record_it_cannot_undo_and_retries_it_later(
    dirs: PluginDirs, api: FakeKube, kubelet: Kubelet, caplog: pytest.LogCaptureFixture
) -> None:
    stuck, fine = limiter_claim(api, "stuck", 1), limiter_claim(api, "fine", 2, "gpu-1")
    with running_plugin(dirs, api):
        kubelet.register()
        assert all(a.error == "" for a in kubelet.prepare(stuck, fine).values())
        kubelet.close()
    block(spec_path(dirs, stuck))  # the first record the sweep meets cannot be undone
    api.delete("ResourceClaim", "stuck", "default")
    api.delete("ResourceClaim", "fine", "default")
    caplog.set_level(logging.WARNING)
    with running_plugin(dirs, api, boot_id="boot-2", stale_claim_interval_s=3600) as plugin:
        plugin.plugin.preparer.collect_stale()
        assert set(dirs.checkpoint().claims) == {uid_of(stuck)}, "the other deleted claim is undone"
        assert not spec_path(dirs, fine).exists() and dirs.claim_dirs() == [uid_of(stuck)]
        assert sample(plugin, "dra_gpu_stale_claims_uncleaned") == 1
        warnings = [r for r in caplog.records if "undoing a stale claim failed" in r.getMessage()]
        assert (
            warnings
            and f"{spec_path(dirs, stuck)}: Is a directory (EISDIR)" in warnings[-1].__dict__["error"]
        )

        unblock(spec_path(dirs, stuck))
        plugin.plugin.preparer.collect_stale()
        assert dirs.checkpoint().claims == {} and dirs.spec_files() == []
        assert sample(plugin, "dra_gpu_stale_claims_uncleaned") == 0


def test_a_temporary_file_of_an_interrupted_write_does_not_keep_a_claims_directory(
    dirs: PluginDirs, api: FakeKube, kubelet: Kubelet
) -> None:
    claim = limiter_claim(api, "c", 1)
    with running_plugin(dirs, api):
        kubelet.register()
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        claim_dir = dirs.state_dir / "claims" / uid_of(claim)
        (claim_dir / ".ld.so.preload.k9x2_q7z").write_text("")  # a kill between mkstemp and rename
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert not claim_dir.exists()


def test_the_sweep_removes_old_temporary_files_and_directories_no_record_accounts_for(
    dirs: PluginDirs, api: FakeKube
) -> None:
    orphan = dirs.state_dir / "claims" / "3d000000-0000-4000-8000-000000000001"
    orphan.mkdir(parents=True)
    (orphan / ".limits.a1b2c3d4").write_text("")
    old_spec_tmp = (
        dirs.cdi_dir / ".gpu.dra-gpu.io-claim_3d000000-0000-4000-8000-000000000002.json.q1w2e3r4.tmp"
    )
    new_spec_tmp = (
        dirs.cdi_dir / ".gpu.dra-gpu.io-claim_3d000000-0000-4000-8000-000000000003.json.z9x8c7v6.tmp"
    )
    old_spec_tmp.write_text("")
    new_spec_tmp.write_text("")  # a write in progress: too young to be a leftover
    an_hour_ago = time.time() - 3600
    os.utime(old_spec_tmp, (an_hour_ago, an_hour_ago))
    with running_plugin(dirs, api, stale_claim_interval_s=3600) as plugin:
        plugin.plugin.preparer.collect_stale()
        assert not orphan.exists() and not old_spec_tmp.exists()
        assert new_spec_tmp.exists()


def test_file_system_errors_name_the_file_and_the_errno_in_words(
    dirs: PluginDirs, api: FakeKube, kubelet: Kubelet
) -> None:
    claim = limiter_claim(api, "c", 1)
    not_a_dir = dirs.root / "a-file"
    not_a_dir.write_text("")
    with running_plugin(dirs, api, cdi_dir=not_a_dir / "cdi"):
        kubelet.register()
        error = kubelet.prepare(claim)[uid_of(claim)].error
    assert error == f"prepare of default/c: {not_a_dir / 'cdi'}: Not a directory (ENOTDIR)", error

    journal = dirs.state_dir / "checkpoint.json.journal"
    with running_plugin(dirs, api):
        kubelet.register()
        block(journal)
        error = kubelet.prepare(claim)[uid_of(claim)].error
        assert error == f"reading the checkpoint {journal}: Is a directory (EISDIR)", error
        unblock(journal)
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}


def test_temporary_files_of_the_mig_record_and_the_checkpoint_left_by_kills_are_removed_at_start(
    dirs: PluginDirs, api: FakeKube
) -> None:
    dirs.state_dir.mkdir(parents=True)
    left = [
        dirs.state_dir / ".mig-instances.k2j3h4g5.tmp",
        dirs.state_dir / ".mig-instances.a8s7d6f5.tmp",
        dirs.state_dir / ".checkpoint.json.tmp",
        dirs.state_dir / ".checkpoint.json.journal.tmp",
    ]
    for path in left:
        path.write_text("{")  # written only under the node lock: at start, each is a kill's leftover
    with running_plugin(dirs, api, stale_claim_interval_s=3600):
        assert [p.name for p in left if p.exists()] == []
