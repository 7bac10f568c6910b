"""The checkpoint's journal: a change costs one appended line, a line a kill cut short never happened, a
reader follows another process's appends without reading everything again, and an agent killed (-9) in
the middle of concurrent prepares starts again from a checkpoint where every claim is prepared, interrupted
(and finished by the kubelet's next call) or untouched."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc
import pytest
from plugin_harness import (
    Kubelet,
    PluginDirs,
    PluginProcess,
    share_claim,
    uid_of,
    write_snapshot,
)
from waiting import wait_for

from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.checkpoint import (
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    ClaimState,
    Hold,
    PreparedClaim,
    ShareRecord,
)


def record(uid: str, state: ClaimState = ClaimState.PREPARE_COMPLETED, gpu: str = "GPU-0") -> PreparedClaim:
    return PreparedClaim(
        uid=uid,
        namespace="default",
        name=f"c-{uid}",
        state=state,
        shares=[ShareRecord(device="gpu-0", gpu=gpu, strategy="Limiter")],
        holds=[Hold(kind="dir", key=f"dir:{uid}")],
    )


def test_a_change_appends_one_line_and_a_new_reader_sees_it(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path)
    store.put(record("a", ClaimState.PREPARE_STARTED))
    snapshot = path.read_bytes()
    store.put(record("a"))
    store.put(record("b"))
    store.drop("a")
    store.set_rebuild_pending(True)
    assert path.read_bytes() == snapshot, "the snapshot is not rewritten for a change"
    lines = store.journal_path.read_text().splitlines()
    assert json.loads(lines[0])["kind"] == "DraGpuCheckpointJournal" and len(lines) == 1 + 5
    loaded = CheckpointStore(path).load()
    assert set(loaded.claims) == {"b"} and loaded.rebuildPending

    store.compact()
    assert not store.journal_path.exists()
    document = json.loads(path.read_text())
    assert document["version"] == 2 and set(document["data"]["claims"]) == {"b"}
    assert CheckpointStore(path).load() == Checkpoint(claims={"b": record("b")}, rebuildPending=True)


def store_with_a_and_b(tmp_path: Path) -> CheckpointStore:
    """A checkpoint under `tmp_path` whose journal holds claims `a` and `b`, one appended line each."""
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.put(record("a"))
    store.put(record("b"))
    return store


def test_a_line_a_kill_cut_short_never_happened_and_the_next_write_cuts_it_off(tmp_path: Path) -> None:
    store = store_with_a_and_b(tmp_path)
    journal = store.journal_path.read_bytes()
    store.journal_path.write_bytes(journal[: len(journal) - 40])  # the last write, interrupted
    survivor = CheckpointStore(store.path)
    assert set(survivor.load().claims) == {"a"}
    survivor.put(record("c"))
    assert set(CheckpointStore(store.path).load().claims) == {"a", "c"}
    assert all(line.endswith("}") for line in survivor.journal_path.read_text().splitlines())


def test_a_damaged_line_is_not_trusted(tmp_path: Path) -> None:
    store = store_with_a_and_b(tmp_path)
    text = store.journal_path.read_text()
    store.journal_path.write_text(text.replace('"c-a"', '"c-x"'))
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch"):
        CheckpointStore(store.path).load()


def test_a_journal_that_follows_another_snapshot_is_ignored(tmp_path: Path) -> None:
    """A crash between writing a snapshot and removing the journal it folded in."""
    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path)
    store.put(record("a"))
    old_journal = store.journal_path.read_bytes()
    store.compact()
    store.journal_path.write_bytes(old_journal)
    store.drop("a")
    assert CheckpointStore(path).load().claims == {}


def test_a_reader_follows_anothers_appends_without_reading_everything_again(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    writer, reader = CheckpointStore(path), CheckpointStore(path)
    for i in range(50):
        writer.put(record(f"u{i}", gpu=f"GPU-{i % 2}"))
    reader.load()
    reloads = reader.reloads
    writer.put(record("late", gpu="GPU-1"))
    writer.drop("u0")
    assert set(reader.load().claims) == {f"u{i}" for i in range(1, 50)} | {"late"}
    assert reader.reloads == reloads, "only the appended lines were read"
    assert [r.uid for r in reader.on_gpu("GPU-1")][-1] == "late"
    assert reader.holders("dir:late") == {"late"} and reader.holders("dir:u0") == set()
    writer.compact()
    assert set(reader.load().claims) == set(writer.load().claims) and reader.reloads == reloads + 1


def test_killed_during_concurrent_prepares_the_agent_starts_again_consistent(dirs: PluginDirs) -> None:
    api = FakeKube()
    claims = [
        share_claim(api, f"c-{i}", device=f"gpu-{i % 2}", share=i, memory="1Gi", cores="2") for i in range(24)
    ]
    snapshot = dirs.root / "cluster.json"
    write_snapshot(api, snapshot)
    doomed = PluginProcess(dirs, snapshot).start()
    started = threading.Event()

    def caller(mine: list[dict]) -> None:
        kubelet = Kubelet(dirs.registration_dir, timeout_s=20)
        kubelet.register()
        started.set()
        for claim in mine:
            try:
                kubelet.prepare(claim)
            except grpc.RpcError:
                return  # the agent is gone
        kubelet.close()

    threads = [threading.Thread(target=caller, args=(claims[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    started.wait(10)
    wait_for(lambda: len(dirs.spec_files()) >= 2, what="the first claims prepared")
    doomed.kill_group()  # SIGKILL, mid-flight
    for thread in threads:
        thread.join(30)

    checkpoint = dirs.checkpoint()  # the files load: a torn last line is no damage
    specs = set(dirs.spec_files())
    for uid, entry in checkpoint.claims.items():
        if entry.state == ClaimState.PREPARE_COMPLETED:
            assert f"gpu.dra-gpu.io-claim_{uid}.json" in specs and uid in dirs.claim_dirs()
    recorded = {f"gpu.dra-gpu.io-claim_{uid}.json" for uid in checkpoint.claims}
    assert specs <= recorded, "no spec without a record"

    plugin = PluginProcess(dirs, snapshot).start()
    try:
        kubelet = Kubelet(dirs.registration_dir, timeout_s=60)
        kubelet.register()
        assert all(a.error == "" for a in kubelet.prepare(*claims).values())
        done = dirs.checkpoint()
        assert set(done.claims) == {uid_of(c) for c in claims}
        assert {c.state for c in done.claims.values()} == {ClaimState.PREPARE_COMPLETED}
        assert set(kubelet.unprepare(*claims).values()) == {""}
        kubelet.close()
    finally:
        assert plugin.terminate() == 0, plugin.log()
    assert dirs.spec_files() == [] and dirs.claim_dirs() == [] and dirs.checkpoint().claims == {}
