"""The checkpoint: versioned, checksummed, tolerant of newer writers, and never a reason to crash-loop."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from plugin_harness import (
    NODE,
    PROFILE,
    Alloc,
    Kubelet,
    PluginDirs,
    add_claim,
    cdi_ids,
    gpu_config,
    opaque,
    registered_kubelet,
    resolve,
    running_plugin,
    share_claim,
    simulated_gpu_state,
    uid_of,
)
from waiting import wait_for

from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube import ApiError
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.checkpoint import (
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    ClaimState,
    Hold,
    PreparedClaim,
    _checksum,
)

GPU0, GPU1 = (g.uuid for g in SimulatedInventory(PROFILE, seed=NODE).gpus())


def sample() -> Checkpoint:
    claim = PreparedClaim(
        uid="u1",
        namespace="default",
        name="c",
        state=ClaimState.PREPARE_COMPLETED,
        bootId="b",
        holds=[Hold(kind="timeslice", key=f"timeslice:{GPU0}", params={"index": 0, "interval": "Long"})],
    )
    return Checkpoint(claims={"u1": claim})


def test_round_trip_and_file_format(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    assert store.load() == Checkpoint() and not store.exists()
    store.save(sample())
    document = json.loads((tmp_path / "checkpoint.json").read_text())
    assert document["kind"] == "DraGpuCheckpoint" and document["version"] == 2
    assert document["checksum"] == _checksum(document["data"])
    assert CheckpointStore(tmp_path / "checkpoint.json").load() == sample()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"], "no temporary files left"


def test_a_record_whose_state_moved_on_is_journalled_as_a_whole_serialisation_would_be(
    tmp_path: Path,
) -> None:
    """PrepareStarted becoming PrepareCompleted reuses the stored text; what another reader gets (checksums
    over the canonical JSON) is the record, in the same bytes as serialising it afresh."""
    store = CheckpointStore(tmp_path / "checkpoint.json")
    started = (
        sample()
        .claims["u1"]
        .model_copy(
            update={
                "state": ClaimState.PREPARE_STARTED,
                "cdiSpec": {"kind": "x/claim", "state": "PrepareStarted"},
            }
        )
    )
    store.put(started)
    store.put(started.model_copy(update={"state": ClaimState.PREPARE_COMPLETED}))
    line = store.journal_path.read_text().splitlines()[-1]
    entry = json.loads(line)["entry"]
    assert line.endswith(',"entry":' + json.dumps(entry, sort_keys=True, separators=(",", ":")) + "}")
    assert json.loads(line)["checksum"] == _checksum(entry)
    again = CheckpointStore(tmp_path / "checkpoint.json").load().claims["u1"]
    assert again.state == ClaimState.PREPARE_COMPLETED and again.cdiSpec == started.cdiSpec


def test_fields_from_a_newer_plugin_are_ignored_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    CheckpointStore(path).save(sample())
    document = json.loads(path.read_text())
    document["data"]["claims"]["u1"]["futureField"] = {"x": 1}
    document["data"]["nodeLabels"] = ["y"]
    document["checksum"] = _checksum(document["data"])
    path.write_text(json.dumps(document))
    assert CheckpointStore(path).load().claims["u1"].holds == sample().claims["u1"].holds


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"", "the file is empty"),
        (b"[]", "not a JSON object"),
        (
            json.dumps({"kind": "DraGpuCheckpoint", "version": "2b", "data": {}}).encode(),
            "unknown version '2b'",
        ),
        (json.dumps({"kind": "Other", "version": 1}).encode(), "kind is 'Other'"),
        ("flip", "checksum mismatch"),
    ],
)
def test_untrusted_files_are_reported(tmp_path: Path, content: bytes | str, reason: str) -> None:
    path = tmp_path / "checkpoint.json"
    CheckpointStore(path).save(sample())
    if content == "flip":
        path.write_text(path.read_text().replace('"Long"', '"Short"'))
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    with pytest.raises(CheckpointCorrupt, match=reason):
        CheckpointStore(path).load()


def prepare_three(dirs: PluginDirs, api: FakeKube) -> list[dict]:
    claims = [
        add_claim(api, "mps", [Alloc(device="gpu-0")], [opaque(gpu_config("MPS"))]),
        share_claim(api, "lim", device="gpu-1", share=1, cores="10"),
        share_claim(
            api, "ts", "TimeSlicing", device="gpu-1", share=2, cores="10", timeSlicing={"interval": "Short"}
        ),
    ]
    with registered_kubelet(dirs, api) as (_, kubelet):
        assert all(r.error == "" for r in kubelet.prepare(*claims).values())
    return claims


@pytest.mark.parametrize("damage", ["garbage", "checksum", "version", "truncated"])
def test_a_corrupt_checkpoint_is_set_aside_and_the_state_rebuilt(
    dirs: PluginDirs, damage: str, caplog
) -> None:
    api = FakeKube()
    mps, lim, ts = prepare_three(dirs, api)
    path = dirs.state_dir / "checkpoint.json"
    text = path.read_text()
    path.write_text(
        {
            "garbage": "\x00\x01 definitely not a checkpoint",
            "checksum": text.replace('"Short"', '"Long"'),
            "version": text.replace(
                '"version":2', '"version":0'
            ),  # a newer one is refused: test_checkpoint_formats
            "truncated": text[: len(text) // 2],
        }[damage]
    )
    api.delete("ResourceClaim", "ts", "default")  # its pod went away while the state was lost
    caplog.set_level(logging.INFO)
    with running_plugin(dirs, api) as plugin:
        assert any(
            "checkpoint cannot be trusted" in r.getMessage()
            for r in caplog.records
            if r.levelno == logging.ERROR
        )
        assert len(list(dirs.state_dir.glob("checkpoint.json.corrupt-*"))) == 1
        rebuilt = dirs.checkpoint()
        assert set(rebuilt.claims) == {uid_of(mps), uid_of(lim)}
        assert {c.state for c in rebuilt.claims.values()} == {ClaimState.PREPARE_COMPLETED}
        assert sorted(dirs.spec_files()) == sorted(
            f"gpu.dra-gpu.io-claim_{uid_of(c)}.json" for c in (mps, lim)
        ), "the deleted claim's spec is gone, the others are kept"
        state = simulated_gpu_state(dirs)
        assert set(state["mps"]) == {GPU0}, "the MPS daemon in use keeps running"
        assert state["timeslice"] == {}, "nobody holds a time slice any more"

        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert kubelet.prepare(mps)[uid_of(mps)].error == ""
        assert set(kubelet.unprepare(mps, lim, ts).values()) == {""}
        kubelet.close()
        assert plugin.plugin.preparer.snapshot().claims == {}
    assert dirs.spec_files() == [] and dirs.claim_dirs() == []
    assert simulated_gpu_state(dirs) == {"computeMode": {}, "timeslice": {}, "mps": {}}


class BrokenList(FakeKube):
    """An API server that stopped answering lists."""

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        raise ApiError("connection refused")


class Unreachable(BrokenList):
    """An API server that does not answer at all."""

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        raise ApiError("connection refused")


def test_without_the_api_the_rebuild_removes_nothing_and_unprepare_cleans_up(dirs: PluginDirs) -> None:
    api = FakeKube()
    _, lim, ts = prepare_three(dirs, api)
    (dirs.state_dir / "checkpoint.json").write_text("corrupt")
    broken = BrokenList()
    with running_plugin(dirs, broken):
        assert len(dirs.spec_files()) == 3 and dirs.claim_dirs() == sorted([uid_of(lim), uid_of(ts)])
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert kubelet.unprepare(lim) == {uid_of(lim): ""}
        kubelet.close()
        assert len(dirs.spec_files()) == 2 and dirs.claim_dirs() == [uid_of(ts)]


def test_after_a_reboot_a_repeated_prepare_rewrites_specs_and_settings(dirs: PluginDirs) -> None:
    api = FakeKube()
    claims = prepare_three(dirs, api)
    before = {uid_of(c): dirs.checkpoint().claims[uid_of(c)].devices for c in claims}
    for spec in dirs.cdi_dir.iterdir():  # /var/run/cdi is a tmpfs
        spec.unlink()
    dirs.simulated_state.unlink()  # GPU settings and daemons do not survive a reboot
    with registered_kubelet(dirs, api, boot_id="boot-2") as (_, kubelet):
        answers = kubelet.prepare(*claims)
        for claim in claims:
            answer = answers[uid_of(claim)]
            assert [list(d.cdi_device_ids) for d in answer.devices] == [
                d.cdiDeviceIds for d in before[uid_of(claim)]
            ]
            resolve(dirs, cdi_ids(answer))
        state = simulated_gpu_state(dirs)
        assert set(state["mps"]) == {GPU0} and state["timeslice"] == {"1": 1}
        assert state["computeMode"] == {GPU0: "EXCLUSIVE_PROCESS"}
        assert {c.bootId for c in dirs.checkpoint().claims.values()} == {"boot-2"}


def test_a_lost_spec_is_rewritten_without_the_api(dirs: PluginDirs) -> None:
    api = FakeKube()
    claims = prepare_three(dirs, api)
    (dirs.cdi_dir / dirs.spec_files()[0]).unlink()
    with registered_kubelet(dirs, Unreachable()) as (_, kubelet):
        answers = kubelet.prepare(*claims)
        assert {a.error for a in answers.values()} == {""}
        assert len(dirs.spec_files()) == 3


def test_a_missing_checkpoint_with_specs_on_disk_triggers_a_rebuild(dirs: PluginDirs) -> None:
    api = FakeKube()
    mps, lim, ts = prepare_three(dirs, api)
    (dirs.state_dir / "checkpoint.json").unlink()
    with running_plugin(dirs, api):
        assert set(dirs.checkpoint().claims) == {uid_of(mps), uid_of(lim), uid_of(ts)}


def test_records_from_before_a_reboot_whose_claims_are_gone_are_collected(dirs: PluginDirs) -> None:
    api = FakeKube()
    mps, lim, _ = prepare_three(dirs, api)
    api.delete("ResourceClaim", "ts", "default")  # its pod did not come back after the reboot
    with running_plugin(dirs, api, boot_id="boot-2", stale_claim_interval_s=3600) as plugin:
        plugin.plugin.preparer.collect_stale()
        assert set(dirs.checkpoint().claims) == {uid_of(mps), uid_of(lim)}
        assert simulated_gpu_state(dirs)["timeslice"] == {}, "its time slice is released"


def test_files_of_a_lost_write_are_removed_at_start(dirs: PluginDirs) -> None:
    api = FakeKube()
    _, lim, ts = prepare_three(dirs, api)
    lost = "6b9a3c1e-0000-4000-8000-00000000beef"
    (dirs.cdi_dir / f"gpu.dra-gpu.io-claim_{lost}.json").write_text(
        (dirs.cdi_dir / f"gpu.dra-gpu.io-claim_{uid_of(lim)}.json").read_text()
    )
    (dirs.state_dir / "claims" / lost / "limiter").mkdir(parents=True)
    with running_plugin(dirs, api):
        assert lost not in "".join(dirs.spec_files()) and lost not in dirs.claim_dirs()
        assert len(dirs.spec_files()) == 3 and dirs.claim_dirs() == sorted([uid_of(lim), uid_of(ts)])


def test_a_rebuild_without_the_api_is_finished_once_the_api_answers(dirs: PluginDirs) -> None:
    api = FakeKube()
    mps, lim, _ = prepare_three(dirs, api)
    (dirs.state_dir / "checkpoint.json").write_text("corrupt")
    api.delete("ResourceClaim", "ts", "default")
    with running_plugin(dirs, BrokenList(), stale_claim_interval_s=3600):
        assert dirs.checkpoint().rebuildPending and len(dirs.spec_files()) == 3
    with running_plugin(dirs, api, stale_claim_interval_s=3600):
        checkpoint = dirs.checkpoint()
        assert not checkpoint.rebuildPending
        assert set(checkpoint.claims) == {uid_of(mps), uid_of(lim)}
        assert len(dirs.spec_files()) == 2
        assert simulated_gpu_state(dirs)["timeslice"] == {}


def test_setup_this_version_does_not_know_is_reported_not_guessed(dirs: PluginDirs) -> None:
    api = FakeKube()
    _, lim, _ = prepare_three(dirs, api)
    store = CheckpointStore(dirs.state_dir / "checkpoint.json")
    checkpoint = store.load()
    checkpoint.claims[uid_of(lim)].holds.append(Hold(kind="nvml-memcap", key=f"nvml-memcap:{GPU1}"))
    store.save(checkpoint)  # as a newer plugin would have written it
    with registered_kubelet(dirs, api) as (_, kubelet):
        assert kubelet.unprepare(lim)[uid_of(lim)] == (
            f"the checkpoint records node-side setup of kind 'nvml-memcap' (nvml-memcap:{GPU1}), which this "
            "version of the plugin cannot apply or undo; run the plugin version that prepared the claim"
        )


def reallocate(api: FakeKube, claim: dict[str, Any], results: list[Any], configs: list[Any]) -> None:
    """Deallocate the claim, then allocate it again (same UID), as after its pods went and new ones came."""
    name = claim["metadata"]["name"]
    status = api.get("ResourceClaim", name, "default")["status"]
    api.update_status("ResourceClaim", {**api.get("ResourceClaim", name, "default"), "status": {}})
    status["allocation"]["devices"] = {"results": results, "config": configs}
    api.update_status("ResourceClaim", {**api.get("ResourceClaim", name, "default"), "status": status})


def test_a_repeated_prepare_after_a_new_allocation_prepares_the_new_one(dirs: PluginDirs) -> None:
    api = FakeKube()
    claim = add_claim(api, "again", [Alloc(device="gpu-0")])
    with registered_kubelet(dirs, api) as (_, kubelet):
        assert [d.device_name for d in kubelet.prepare(claim)[uid_of(claim)].devices] == ["gpu-0"]
        # The unprepare never reached us; meanwhile the claim was allocated again, on the other GPU.
        ts = [opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Long"}))]
        reallocate(api, claim, [Alloc(device="gpu-1").result()], ts)
        answer = kubelet.prepare(claim)[uid_of(claim)]
        assert answer.error == "" and [d.device_name for d in answer.devices] == ["gpu-1"]
        assert resolve(dirs, cdi_ids(answer)).env["DRAGPU_DEVICE_GPU_1"] == GPU1
        assert [s.device for s in dirs.checkpoint().claims[uid_of(claim)].shares] == ["gpu-1"]
        assert simulated_gpu_state(dirs)["timeslice"] == {"1": 3}
        assert kubelet.prepare(claim)[uid_of(claim)].devices == answer.devices, "and now it is idempotent"
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert simulated_gpu_state(dirs)["timeslice"] == {} and dirs.spec_files() == []


def test_a_repeated_prepare_of_the_same_allocation_leaves_the_claims_setup_alone(dirs: PluginDirs) -> None:
    api = FakeKube()
    share = "0f6e3a4e-5d2c-4b8a-9d55-1c0e7f3a9b01"
    alloc = Alloc(device="gpu-0", share_id=share, consumed={"memory": "1Gi", "cores": "10"})
    mps = [opaque(gpu_config("MPS"))]
    claim = add_claim(api, "same", [alloc], mps)
    commands = SimulatedCommands(state_file=dirs.simulated_state)
    with registered_kubelet(dirs, api, commands=commands) as (_, kubelet):
        first = kubelet.prepare(claim)[uid_of(claim)]
        # The same allocation as a newer API server returns it, with a field this plugin does not know.
        reallocate(api, claim, [{**alloc.result(), "bindingConditions": []}], mps)
        calls = len(commands.calls)
        assert kubelet.prepare(claim)[uid_of(claim)] == first
        assert commands.calls[calls:] == [], "the MPS daemon its clients use is neither stopped nor restarted"


def test_a_checkpoint_damaged_while_running_is_rebuilt_by_the_next_call(dirs: PluginDirs) -> None:
    api = FakeKube()
    mps, lim, ts = prepare_three(dirs, api)
    with running_plugin(dirs, api) as plugin:
        (dirs.state_dir / "checkpoint.json").write_text("\x00 damaged while the agent runs")
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert kubelet.prepare(lim)[uid_of(lim)].error == ""
        kubelet.close()

        def rebuilt() -> bool:  # by this call, or by the supervision loop that saw the damage first
            snapshot = plugin.plugin.preparer.snapshot()
            return not snapshot.rebuildPending and set(snapshot.claims) == {uid_of(c) for c in (mps, lim, ts)}

        wait_for(rebuilt, what="the claims rebuilt from the damaged checkpoint")
    assert len(list(dirs.state_dir.glob("checkpoint.json.corrupt-*"))) == 1


def test_a_rebuild_that_readopted_an_unprepared_claim_has_its_record_collected_once_the_claim_is_gone(
    dirs: PluginDirs,
) -> None:
    """The kubelet unprepared the MPS claim, then the checkpoint was lost while the API still listed the
    claim as reserved: the rebuild prepares it again, and no kubelet call will ever unprepare it. Once
    the claim is deleted, the sweep undoes the record (MPS daemon, compute mode), so that a whole-GPU
    claim fits on the GPU again."""
    api = FakeKube()
    mps, _, _ = prepare_three(dirs, api)
    with registered_kubelet(dirs, api, stale_claim_interval_s=3600) as (_, kubelet):
        assert kubelet.unprepare(mps) == {uid_of(mps): ""}
    (dirs.state_dir / "checkpoint.json").write_text("corrupt")
    with running_plugin(dirs, api, stale_claim_interval_s=3600) as plugin:
        assert uid_of(mps) in dirs.checkpoint().claims, "re-adopted: the API says it is reserved"
        assert GPU0 in simulated_gpu_state(dirs)["mps"]
        api.delete("ResourceClaim", "mps", "default")
        plugin.plugin.preparer.collect_stale()  # the first sweep to find it gone leaves it to the kubelet
        plugin.plugin.preparer.collect_stale()
        assert uid_of(mps) not in dirs.checkpoint().claims
        state = simulated_gpu_state(dirs)
        assert GPU0 not in state["mps"] and GPU0 not in state["computeMode"]
        whole = add_claim(api, "whole", [Alloc(device="gpu-0")])
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert kubelet.prepare(whole)[uid_of(whole)].error == ""
        kubelet.close()


def test_a_completed_record_of_a_deallocated_claim_is_collected(
    dirs: PluginDirs,
) -> None:
    api = FakeKube()
    _, lim, ts = prepare_three(dirs, api)
    deallocated = api.get("ResourceClaim", "ts", "default")
    deallocated["status"] = {}
    api.update_status("ResourceClaim", deallocated)
    with running_plugin(dirs, api, stale_claim_interval_s=3600) as plugin:
        plugin.plugin.preparer.collect_stale()
        plugin.plugin.preparer.collect_stale()
        assert uid_of(ts) not in dirs.checkpoint().claims
        assert uid_of(lim) in dirs.checkpoint().claims, "allocated here and in the API: kept"
        assert simulated_gpu_state(dirs)["timeslice"] == {}
