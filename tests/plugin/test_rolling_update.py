"""Two agents on one node, as a rolling update with surge runs them: real `dra-gpu kubelet-plugin` processes,
real sockets, one API server. The kubelet's calls are answered by both, each claim is prepared once, and one
agent at a time publishes the node's ResourceSlices."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_api_server import ApiServer
from plugin_harness import (
    NODE,
    AgentProcess,
    Kubelet,
    PluginDirs,
    cdi_ids,
    kubeconfig_for,
    share_claim,
    uid_of,
)
from waiting import wait_for

from dra_gpu.kube import builders

OLD_POD = "0a1d0000-0000-4000-8000-000000000001"
NEW_POD = "0e3e0000-0000-4000-8000-000000000002"


@pytest.fixture
def server() -> Iterator[ApiServer]:
    s = ApiServer()
    s.fake.create("Node", builders.node(NODE))
    yield s
    s.close()


def limiter_claims(server: ApiServer, count: int) -> list[dict[str, Any]]:
    return [
        share_claim(server.fake, f"roll-{i}", device=f"gpu-{i % 2}", share=i, memory="1Gi", cores="5")
        for i in range(count)
    ]


def fresh_prepares(dirs: PluginDirs) -> Counter[str]:
    """Claim UID -> how often a prepare began from nothing (a PrepareStarted record in the journal)."""
    journal = dirs.state_dir / "checkpoint.json.journal"
    counts: Counter[str] = Counter()
    for line in journal.read_text().splitlines()[1:]:
        entry = json.loads(line)["entry"]
        if entry["op"] == "put" and entry["record"]["state"] == "PrepareStarted":
            counts[entry["uid"]] += 1
    return counts


def test_two_agents_answer_the_kubelet_prepare_each_claim_once_and_one_publishes(
    dirs: PluginDirs, server: ApiServer, tmp_path: Path
) -> None:
    claims = limiter_claims(server, 8)
    kubeconfig = kubeconfig_for(server.url, tmp_path / "kubeconfig")
    publish = {"DRA_GPU_PUBLISH_SLICES": "true"}
    agents = [AgentProcess(dirs, kubeconfig, pod, settings=publish) for pod in (OLD_POD, NEW_POD)]
    try:
        for agent in agents:  # started at once, as the DaemonSet's surge does
            agent.start()
        for agent in agents:
            agent.wait_serving()
        kubelets = [Kubelet(dirs.registration_dir, timeout_s=45) for _ in agents]
        infos = [k.register(socket=a.registration_socket()) for k, a in zip(kubelets, agents, strict=True)]
        assert {info.endpoint for info in infos} == {
            str(dirs.plugins_dir / "gpu.dra-gpu.io" / f"dra-{pod}.sock") for pod in (OLD_POD, NEW_POD)
        }
        # Both agents get the same pod's claims at the same time (a kubelet that turned to the new agent
        # while the old one still answered its call).
        answers: list[dict[str, Any]] = [{}, {}]

        def call(i: int) -> None:
            answers[i] = kubelets[i].prepare(*claims)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        for answer in answers:
            assert {uid: r.error for uid, r in answer.items()} == {uid_of(c): "" for c in claims}
        assert {u: cdi_ids(r) for u, r in answers[0].items()} == {
            u: cdi_ids(r) for u, r in answers[1].items()
        }
        assert fresh_prepares(dirs) == {uid_of(c): 1 for c in claims}, "a claim was prepared twice"

        # One agent publishes; the slices are there.
        leaders: list[AgentProcess] = wait_for(
            lambda: [a for a in agents if a.publishing()], 60, "an agent to publish"
        )
        assert len(leaders) == 1
        assert wait_for(lambda: server.fake.objects("ResourceSlice"), 60, "the node's slices")
        leader = leaders[0]
        other = agents[1 - agents.index(leader)]
        assert not other.publishing()

        # The leader leaves (SIGTERM): only its own sockets go, the other takes over the publishing.
        assert leader.terminate() == 0, leader.log()
        assert not leader.registration_socket().exists()
        assert other.registration_socket().exists()
        wait_for(other.publishing, 60, "the other agent to take over the publishing")
        assert "publishing this node's ResourceSlices" in other.log()

        # The one left unprepares every claim, whichever agent prepared it.
        remaining = kubelets[agents.index(other)]
        assert remaining.unprepare(*claims) == {uid_of(c): "" for c in claims}
        assert dirs.spec_files() == [] and dirs.claim_dirs() == []
        for kubelet in kubelets:
            kubelet.close()
        assert other.terminate() == 0, other.log()
        assert not any(dirs.registration_dir.iterdir()), "an agent left a registration socket behind"
    finally:
        for agent in agents:
            agent.kill()


class HeldApiServer(ApiServer):
    """An API server whose answers to claim reads wait until `release` is set (a slow API server)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.held = threading.Event()

    def route(
        self, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, dict[str, Any]]:
        if method == "GET" and "/resourceclaims/" in path:
            self.held.set()
            self.release.wait(60)
        return super().route(method, path, query, body)


def test_on_sigterm_an_agent_leaves_the_kubelet_at_once_and_finishes_the_call_it_answers(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    server = HeldApiServer()
    agent = AgentProcess(dirs, kubeconfig_for(server.url, tmp_path / "kubeconfig"), OLD_POD)
    try:
        (claim,) = limiter_claims(server, 1)
        agent.start().wait_serving()
        kubelet = Kubelet(dirs.registration_dir, timeout_s=45)
        kubelet.register(socket=agent.registration_socket())
        answer: dict[str, Any] = {}
        call = threading.Thread(target=lambda: answer.update(kubelet.prepare(claim)))
        call.start()
        wait_for(server.held.is_set, 30, "the prepare to read its claim")
        assert agent.process is not None
        agent.process.send_signal(15)
        # The registration goes first: the kubelet turns to the other agent of the update for new calls...
        wait_for(lambda: not agent.registration_socket().exists(), 30, "the registration socket to go")
        assert agent.process.poll() is None and call.is_alive()
        # ...while the call in progress is answered in full.
        server.release.set()
        call.join(60)
        assert answer[uid_of(claim)].error == ""
        assert agent.process.wait(60) == 0, agent.log()
        assert not (dirs.plugins_dir / "gpu.dra-gpu.io" / f"dra-{OLD_POD}.sock").exists()
        kubelet.close()
    finally:
        server.release.set()
        agent.kill()
        server.close()


def test_a_pod_uid_that_cannot_name_a_socket_is_refused(dirs: PluginDirs, tmp_path: Path) -> None:
    agent = AgentProcess(dirs, kubeconfig_for("http://127.0.0.1:9", tmp_path / "kubeconfig"), "../x")
    agent.start()
    assert agent.process is not None and agent.process.wait(60) == 2
    assert "error: --pod-uid '../x' is not a pod UID" in agent.log()
