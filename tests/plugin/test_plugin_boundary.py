"""What the kubelet sends is checked at the gRPC boundary: hostile UIDs and names touch no file, an error
repeats only a short prefix of a bad value, one claim's error never costs another its answer, an answer
never exceeds gRPC's 4 MiB limit, and a call stops starting claims in time to answer before its deadline."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from plugin_harness import (
    Alloc,
    Kubelet,
    PluginDirs,
    PluginProcess,
    add_claim,
    gpu_config,
    opaque,
    registered_kubelet,
    running_plugin,
    share_claim,
    uid_of,
    write_snapshot,
)

from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.calls import DEADLINE_PASSED
from dra_gpu.plugin.checkpoint import ClaimState
from dra_gpu.plugin.errors import MAX_MESSAGE
from dra_gpu.plugin.service import CUT_SHORT
from dra_gpu.proto import dra_v1

HOSTILE_UIDS = [".", "..", "../..", "../../..", "a/../..", "/etc", "x" * 5000, "..\x00", " "]
"""UIDs no API server makes; `../../..` from the claims' directory is the sandbox around the agent."""


def limiter_claim(api: FakeKube, name: str, device: str = "gpu-0", n: int = 1) -> dict[str, Any]:
    return share_claim(api, name, device=device, share=n)


@pytest.fixture
def sandbox() -> Iterator[Path]:
    """A directory around the agent's own, with a file in it that nothing may remove."""
    root = Path(tempfile.mkdtemp(prefix="dg-sbx-", dir="/tmp"))
    (root / "outside").mkdir()
    (root / "outside" / "canary").write_text("still here")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def files_of(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.name.startswith("plugin-")}


def test_hostile_uids_and_names_touch_no_file_of_the_real_agent(sandbox: Path) -> None:
    dirs = PluginDirs.create(parent=sandbox)
    api = FakeKube()
    claims = [limiter_claim(api, "a", "gpu-0", 1), limiter_claim(api, "b", "gpu-1", 2)]
    snapshot = dirs.root / "cluster.json"
    write_snapshot(api, snapshot)
    plugin = PluginProcess(dirs, snapshot).start()
    try:
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        answers = kubelet.prepare(*claims)
        assert all(a.error == "" for a in answers.values())
        before = files_of(sandbox)
        assert {"outside/canary", "state/claims"} <= {p.split("/", 1)[1] for p in before if "/" in p} | before

        for uid in HOSTILE_UIDS:
            for call in (kubelet.unprepare, lambda *c: {u: r.error for u, r in kubelet.prepare(*c).items()}):
                errors = call(("default", "a", uid))
                assert list(errors) == [uid]
                assert "is not a claim UID" in errors[uid], errors[uid]
                assert len(errors[uid]) < 400, "the UID is quoted only in part"
        for namespace, name in [
            ("default", "a\ndevice=GPU-0 memory=unlimited"),
            ("../x", "a"),
            ("default", "A"),
        ]:
            errors = kubelet.unprepare((namespace, name, uid_of(claims[0])))
            assert "the kubelet sent an invalid claim" in errors[uid_of(claims[0])]
            answer = kubelet.prepare((namespace, name, uid_of(claims[1])))[uid_of(claims[1])]
            assert "the kubelet sent an invalid claim" in answer.error and not answer.devices

        assert files_of(sandbox) == before, "no file was removed or added"
        assert (sandbox / "outside" / "canary").read_text() == "still here"
        assert kubelet.prepare(*claims) == answers, "both claims are still prepared, as they were"
        assert set(kubelet.unprepare(*claims).values()) == {""}
        kubelet.close()
    finally:
        assert plugin.terminate() == 0, plugin.log()
    assert dirs.spec_files() == [] and dirs.claim_dirs() == []


def test_the_same_claim_twice_in_a_call_is_prepared_once_and_a_uid_for_two_claims_is_refused(
    dirs: PluginDirs, api: FakeKube, kubelet: Kubelet
) -> None:
    claim = limiter_claim(api, "twice")
    other = limiter_claim(api, "other", n=2)
    uid = uid_of(claim)
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(claim, claim)
        assert list(answers) == [uid] and answers[uid].error == ""
        mixed = kubelet.prepare(claim, ("default", "other", uid))
        assert mixed[uid].error == f"the kubelet sent the claim UID {uid} twice, for different claims"
        assert kubelet.prepare(other)[uid_of(other)].error == ""
        assert set(kubelet.unprepare(claim, other).values()) == {""}


def test_a_huge_value_is_quoted_in_part_and_costs_no_other_claim_its_answer(
    dirs: PluginDirs, api: FakeKube, kubelet: Kubelet, caplog: pytest.LogCaptureFixture
) -> None:
    huge = "x" * 5_000_000
    bad = [
        add_claim(
            api,
            "strategy",
            [Alloc(device="gpu-0")],
            [opaque({**gpu_config(), "sharing": {"strategy": huge}})],
        ),
        add_claim(
            api,
            "memory",
            [Alloc(device="gpu-0")],
            [opaque(gpu_config("Limiter", limiter={"memory": huge}))],
        ),
        add_claim(api, "pool", [Alloc(device="gpu-0", pool="r" * 100_000)]),
    ]
    good = limiter_claim(api, "good", "gpu-1")
    caplog.set_level(logging.DEBUG)
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(*bad, good, *bad)
        assert answers[uid_of(good)].error == "" and answers[uid_of(good)].devices
        for claim in bad:
            error = answers[uid_of(claim)].error
            assert error and len(error) <= MAX_MESSAGE, len(error)
            assert "x" * 65 not in error and "r" * 65 not in error
            assert "more characters" in error
        assert sum(len(r.getMessage()) + len(str(r.__dict__)) for r in caplog.records) < 200_000, (
            "the log does not repeat the value either"
        )
        assert set(kubelet.unprepare(good, *bad).values()) == {""}


def test_an_answer_never_exceeds_grpcs_limit(dirs: PluginDirs, api: FakeKube, kubelet: Kubelet) -> None:
    """1,000 claims whose UIDs take 4,000 bytes each: the request fits, an answer echoing them would not."""
    good = limiter_claim(api, "good")
    hostile = [("default", f"c{i}", f"{i:04d}" + "u" * 3996) for i in range(1000)]
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(good, *hostile)  # the client keeps gRPC's default 4 MiB limit
        assert answers[uid_of(good)].error == "" and answers[uid_of(good)].devices
        answered = [uid for _, _, uid in hostile if uid in answers]
        assert 0 < len(answered) < len(hostile), "the hostile claims that fit are answered, the rest left out"
        assert all(
            answers[uid].error in (CUT_SHORT,) or "is not a claim UID" in answers[uid].error
            for uid in answered
        )
        errors = kubelet.unprepare(good, *hostile)
        assert errors[uid_of(good)] == ""


def test_many_claims_with_long_errors_are_cut_short_each_with_the_reason(
    dirs: PluginDirs, api: FakeKube, kubelet: Kubelet
) -> None:
    """2,200 claims whose errors take 2 KiB each: past 4 MiB the largest answers become a short reason."""
    wordy = {**gpu_config(), "sharing": {"strategy": "Exclusive", "word " * 1000: 1}}
    claims = [add_claim(api, f"wordy-{i}", [Alloc(device="gpu-0")], [opaque(wordy)]) for i in range(2200)]
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(*claims)
        assert set(answers) == {uid_of(c) for c in claims}, "every claim has an answer"
        reasons = [a.error for a in answers.values()]
        assert CUT_SHORT in reasons and any("invalid GpuConfig" in r for r in reasons)
        assert all(len(r) <= MAX_MESSAGE for r in reasons)
        assert dra_v1.NodePrepareResourcesResponse(claims=answers).ByteSize() < 4 * 1024 * 1024


def test_a_call_answers_before_its_deadline_with_the_claims_not_started(
    dirs: PluginDirs, api: FakeKube
) -> None:
    claims = [limiter_claim(api, f"slow-{i}", f"gpu-{i % 2}", i) for i in range(20)]

    def slow(step: str) -> None:
        if step == "prepare:checkpoint-started":
            time.sleep(0.2)

    with running_plugin(dirs, api, fault_hook=slow):
        kubelet = Kubelet(dirs.registration_dir, timeout_s=2.0)
        kubelet.register()
        answers = kubelet.prepare(*claims)  # in time: no DEADLINE_EXCEEDED
        prepared = {uid for uid, a in answers.items() if a.error == ""}
        skipped = {uid for uid, a in answers.items() if a.error == DEADLINE_PASSED}
        assert prepared and skipped and prepared | skipped == {uid_of(c) for c in claims}
        checkpoint = dirs.checkpoint()
        assert set(checkpoint.claims) == prepared
        assert {c.state for c in checkpoint.claims.values()} == {ClaimState.PREPARE_COMPLETED}
        assert sorted(dirs.spec_files()) == sorted(f"gpu.dra-gpu.io-claim_{u}.json" for u in prepared)
        assert set(dirs.claim_dirs()) == prepared, "every claim is prepared or not: nothing in between"
        kubelet.close()

        patient = Kubelet(dirs.registration_dir, timeout_s=60)
        patient.register()
        assert all(a.error == "" for a in patient.prepare(*claims).values())
        assert set(patient.unprepare(*claims).values()) == {""}
        patient.close()


def test_a_deadline_answer_says_the_claim_was_not_started(dirs: PluginDirs, api: FakeKube) -> None:
    claims = [limiter_claim(api, f"c-{i}", n=i) for i in range(3)]
    with running_plugin(dirs, api) as plugin:
        from dra_gpu.plugin.sharing.plan import ClaimInfo

        infos = [ClaimInfo(uid=uid_of(c), namespace="default", name=c["metadata"]["name"]) for c in claims]
        results = plugin.plugin.preparer.prepare(infos, deadline=time.monotonic() - 1)
        assert {r.error for r in results.values()} == {DEADLINE_PASSED}
        assert dirs.checkpoint().claims == {} and dirs.spec_files() == []
        done = threading.Event()
        assert plugin.plugin.preparer.unprepare(infos, deadline=time.monotonic() - 1) == {
            i.uid: DEADLINE_PASSED for i in infos
        }
        done.set()


def test_a_prepared_claims_uid_under_another_name_gets_neither_its_devices_nor_its_undoing(
    dirs: PluginDirs, api: FakeKube
) -> None:
    claim = limiter_claim(api, "owner")
    other = limiter_claim(api, "other", n=2)
    uid = uid_of(claim)
    with registered_kubelet(dirs, api) as (_, kubelet):
        assert kubelet.prepare(claim)[uid].error == ""
        before = dirs.checkpoint().claims[uid]
        for namespace, name in (("default", "other"), ("elsewhere", "owner")):
            forged = (namespace, name, uid)
            answer = kubelet.prepare(forged)[uid]
            assert (
                list(answer.devices) == []
                and f"prepared on this node as ResourceClaim default/owner, not {namespace}/{name}"
                in answer.error
            )
            error = kubelet.unprepare(forged)[uid]
            assert "nothing was changed" in error, error
        assert dirs.checkpoint().claims[uid] == before, "the owner's record is untouched"
        assert dirs.spec_files() == [f"gpu.dra-gpu.io-claim_{uid}.json"]
        assert kubelet.prepare(other)[uid_of(other)].error == ""
        assert kubelet.unprepare(claim, other) == {uid: "", uid_of(other): ""}
