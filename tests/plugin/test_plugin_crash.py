"""Crash safety: the plugin dies at each step of prepare and of unprepare, starts again, the kubelet
repeats its calls, and every claim ends prepared or unprepared as asked, with nothing left behind.

Two ways to die: a real process killed abruptly (`os._exit` at the step, no cleanup of any kind),
and, for the full matrix of steps x claims in the batch, an in-process crash (an exception nothing
catches, the plugin object then discarded) which is faster.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from plugin_harness import (
    CRASH_EXIT_CODE,
    NODE,
    PROFILE,
    Kubelet,
    PluginDirs,
    PluginProcess,
    cdi_ids,
    resolve,
    running_plugin,
    share_claim,
    simulated_gpu_state,
    uid_of,
    write_snapshot,
)

from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi import board
from dra_gpu.plugin.checkpoint import ClaimState
from dra_gpu.plugin.prepare import STEPS
from dra_gpu.plugin.sharing.plan import ClaimInfo

GPU0, GPU1 = (g.uuid for g in SimulatedInventory(PROFILE, seed=NODE).gpus())
PREPARE_STEPS = [s for s in STEPS if s.startswith("prepare:")]
UNPREPARE_STEPS = [s for s in STEPS if s.startswith("unprepare:")]


@dataclass
class Cluster:
    dirs: PluginDirs
    api: FakeKube
    claims: list[dict[str, Any]]

    def infos(self) -> list[ClaimInfo]:
        return [
            ClaimInfo(uid=uid_of(c), namespace="default", name=c["metadata"]["name"]) for c in self.claims
        ]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """Three claims of one pod, one per GPU-wide mechanism: MPS on gpu-0, limiter and time-slicing on gpu-1."""
    dirs = PluginDirs.create()
    api = FakeKube()
    claims = [
        share_claim(api, "mps", "MPS", device="gpu-0", share=10, memory="10Gi", cores="30"),
        share_claim(api, "lim", "Limiter", device="gpu-1", share=11, memory="4Gi", cores="20"),
        share_claim(
            api,
            "ts",
            "TimeSlicing",
            device="gpu-1",
            share=12,
            memory="8Gi",
            cores="10",
            timeSlicing={"interval": "Medium"},
        ),
    ]
    yield Cluster(dirs, api, claims)
    dirs.cleanup()


def assert_prepared(cluster: Cluster, answers: dict[str, Any]) -> None:
    dirs = cluster.dirs
    for claim in cluster.claims:
        answer = answers[uid_of(claim)]
        assert answer.error == ""
        resolve(dirs, cdi_ids(answer))  # every returned id resolves
    checkpoint = dirs.checkpoint()
    assert {c.state for c in checkpoint.claims.values()} == {ClaimState.PREPARE_COMPLETED}
    assert len(checkpoint.claims) == len(dirs.spec_files()) == 3
    state = simulated_gpu_state(dirs)
    assert state["computeMode"] == {GPU0: "EXCLUSIVE_PROCESS"}
    assert set(state["mps"]) == {GPU0}
    assert state["timeslice"] == {"1": 2}
    # Every claim has a limiter budget: the limiter's, the MPS claim's pooled memory, and the
    # time-sliced claim's cap beside the limiter claim.
    uids = [uid_of(c) for c in cluster.claims]
    assert dirs.claim_dirs() == sorted(uids)
    assert all((dirs.state_dir / "claims" / uid / "limiter").is_dir() for uid in uids)
    # Elastic compute: the limiter claim (20 % of gpu-1) is on its GPU's board, and only it.
    (lim,) = [c for c in cluster.claims if c["metadata"]["name"] == "lim"]
    boards = sorted((dirs.state_dir / "gpus").glob("*/board"))
    assert [board.read_board(b) for b in boards] == [[board.Entry(uid_of(lim), 20, 20)]]
    assert (boards[0].parent / f"{uid_of(lim)}.activity").is_file()


def assert_clean(dirs: PluginDirs) -> None:
    assert dirs.spec_files() == []
    assert dirs.claim_dirs() == []
    assert dirs.checkpoint().claims == {}
    assert simulated_gpu_state(dirs) == {"computeMode": {}, "timeslice": {}, "mps": {}}
    assert not (dirs.state_dir / "mps").exists() or list((dirs.state_dir / "mps").iterdir()) == []
    for gpu in (dirs.state_dir / "gpus").glob("*"):  # kept for the GPU's next claim, with nobody on it
        assert [p.name for p in gpu.iterdir()] == ["board"] and board.read_board(gpu / "board") == []


# -- a real process, killed ------------------------------------------------------------------------------
def kubelet_for(dirs: PluginDirs) -> Kubelet:
    kubelet = Kubelet(dirs.registration_dir, timeout_s=20)
    kubelet.register()
    return kubelet


@pytest.mark.parametrize("step", PREPARE_STEPS)
def test_killed_during_prepare_then_prepared_on_retry(cluster: Cluster, step: str) -> None:
    dirs, snapshot = cluster.dirs, cluster.dirs.root / "cluster.json"
    write_snapshot(cluster.api, snapshot)
    doomed = PluginProcess(dirs, snapshot, crash_at=step).start()
    kubelet = kubelet_for(dirs)
    with pytest.raises(grpc.RpcError) as call:
        kubelet.prepare(*cluster.claims)
    assert call.value.code() == grpc.StatusCode.UNAVAILABLE
    assert doomed.wait() == CRASH_EXIT_CODE, doomed.log()
    kubelet.close()

    plugin = PluginProcess(dirs, snapshot).start()
    try:
        kubelet = kubelet_for(dirs)
        assert_prepared(cluster, kubelet.prepare(*cluster.claims))
        assert set(kubelet.unprepare(*cluster.claims).values()) == {""}
        assert_clean(dirs)
        kubelet.close()
    finally:
        assert plugin.terminate() == 0, plugin.log()


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
def test_killed_during_unprepare_of_deleted_claims_then_cleaned_on_retry(cluster: Cluster, step: str) -> None:
    dirs, snapshot = cluster.dirs, cluster.dirs.root / "cluster.json"
    write_snapshot(cluster.api, snapshot)
    first = PluginProcess(dirs, snapshot).start()
    kubelet = kubelet_for(dirs)
    assert_prepared(cluster, kubelet.prepare(*cluster.claims))
    kubelet.close()
    assert first.terminate() == 0

    for claim in cluster.claims:  # the pod is gone and so are its claims: unprepare must not need them
        cluster.api.delete("ResourceClaim", claim["metadata"]["name"], "default")
    write_snapshot(cluster.api, snapshot)
    # Without an answer from the API (no snapshot to read), so that the stale-claim sweep at start,
    # which would undo the records of the deleted claims itself, leaves them to the kubelet's call.
    doomed = PluginProcess(dirs, dirs.root / "unreachable.json", crash_at=step).start()
    kubelet = kubelet_for(dirs)
    with pytest.raises(grpc.RpcError):
        kubelet.unprepare(*cluster.claims)
    assert doomed.wait() == CRASH_EXIT_CODE, doomed.log()
    kubelet.close()

    plugin = PluginProcess(dirs, snapshot).start()
    try:
        kubelet = kubelet_for(dirs)
        assert set(kubelet.unprepare(*cluster.claims).values()) == {""}
        assert_clean(dirs)
        kubelet.close()
    finally:
        assert plugin.terminate() == 0, plugin.log()


def test_a_clean_shutdown_removes_the_sockets(cluster: Cluster) -> None:
    snapshot = cluster.dirs.root / "cluster.json"
    write_snapshot(cluster.api, snapshot)
    plugin = PluginProcess(cluster.dirs, snapshot).start()
    kubelet_for(cluster.dirs).close()
    assert cluster.dirs.registration_socket.exists() and cluster.dirs.service_socket.exists()
    assert plugin.terminate() == 0
    assert not cluster.dirs.registration_socket.exists() and not cluster.dirs.service_socket.exists()


# -- in-process crashes: every step x every claim of the batch -------------------------------------------
class Crash(BaseException):
    """Escapes every `except Exception`, as a kill escapes everything."""


def crasher(step: str, nth: int) -> Any:
    seen = [0]

    def hook(reached: str) -> None:
        if reached == step:
            seen[0] += 1
            if seen[0] == nth:
                raise Crash(step)

    return hook


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("step", PREPARE_STEPS)
@pytest.mark.parametrize("then", ["retry", "give-up"])
def test_crash_in_prepare_matrix(cluster: Cluster, step: str, nth: int, then: str) -> None:
    dirs, api, claims = cluster.dirs, cluster.api, cluster.infos()
    with running_plugin(dirs, api, fault_hook=crasher(step, nth)) as plugin, pytest.raises(Crash):
        plugin.plugin.preparer.prepare(claims)
    with running_plugin(dirs, api) as plugin:
        if then == "retry":
            kubelet = kubelet_for(dirs)
            assert_prepared(cluster, kubelet.prepare(*cluster.claims))
            kubelet.close()
        assert set(plugin.plugin.preparer.unprepare(claims).values()) == {""}
    assert_clean(dirs)


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("step", UNPREPARE_STEPS)
@pytest.mark.parametrize("then", ["retry-unprepare", "prepare-again"])
def test_crash_in_unprepare_matrix(cluster: Cluster, step: str, nth: int, then: str) -> None:
    dirs, api, claims = cluster.dirs, cluster.api, cluster.infos()
    with running_plugin(dirs, api, fault_hook=crasher(step, nth)) as plugin:
        assert all(r.error == "" for r in plugin.plugin.preparer.prepare(claims).values())
        with pytest.raises(Crash):
            plugin.plugin.preparer.unprepare(claims)
    with running_plugin(dirs, api) as plugin:
        if then == "prepare-again":  # a new pod of the same claims arrives before the retry
            kubelet = kubelet_for(dirs)
            assert_prepared(cluster, kubelet.prepare(*cluster.claims))
            kubelet.close()
        assert set(plugin.plugin.preparer.unprepare(claims).values()) == {""}
    assert_clean(dirs)


def test_interrupted_claims_whose_claim_is_gone_are_collected(cluster: Cluster) -> None:
    dirs, api, claims = cluster.dirs, cluster.api, cluster.infos()
    with (
        running_plugin(dirs, api, fault_hook=crasher("prepare:setup-applied", 1)) as plugin,
        pytest.raises(Crash),
    ):
        plugin.plugin.preparer.prepare(claims[:1])
    assert simulated_gpu_state(dirs)["mps"] != {} and len(dirs.checkpoint().claims) == 1
    api.delete("ResourceClaim", "mps", "default")
    with running_plugin(dirs, api) as plugin:
        plugin.plugin.preparer.collect_stale()  # also done in the background right after start
    assert_clean(dirs)
