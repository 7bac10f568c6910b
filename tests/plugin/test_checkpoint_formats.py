"""The agent's checkpoint across releases: this release reads what the previous one wrote (a fixture it
wrote), and refuses a newer format with one line, changing nothing (docs/upgrades.md, "Formats")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from plugin_harness import (
    EVERY_MODE_PROFILE,
    NODE,
    AgentProcess,
    PluginDirs,
    registered_kubelet,
    unreachable_kubeconfig,
)
from repo_paths import TESTS

from dra_gpu import __version__
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.checkpoint import CHECKPOINT_VERSION, ClaimState

FIXTURE = TESTS / "fixtures" / "checkpoint-0.1.0"
CLAIMS = {
    "mode-exclusive": ("7fbbded9-28bb-4a87-a427-aad3b18af5ae", "Exclusive"),
    "mode-mps": ("0c88120b-0816-4015-bb9c-88c4bdf55b52", "MPS"),
    "mode-limiter": ("b6676ad8-e342-4e0c-bb5c-4963f1ccbbe2", "Limiter"),
    "mode-timeslicing": ("da9012d8-7fa0-4aa2-aa1b-e68750a8dc98", "TimeSlicing"),
}


def install(dirs: PluginDirs) -> None:
    dirs.state_dir.mkdir(parents=True, exist_ok=True)
    for name in ("checkpoint.json", "checkpoint.json.journal"):
        shutil.copy(FIXTURE / name, dirs.state_dir / name)


def test_this_release_reads_the_checkpoint_of_0_1_0_and_unprepares_its_claims(dirs: PluginDirs) -> None:
    install(dirs)
    inventory = SimulatedInventory(EVERY_MODE_PROFILE, seed=NODE)
    with registered_kubelet(dirs, FakeKube(), inventory=inventory) as (_, kubelet):
        records = dirs.checkpoint().claims
        assert {
            r.name: (r.uid, r.shares[0].strategy if r.shares else "?") for r in records.values()
        } == CLAIMS
        assert {r.state for r in records.values()} == {ClaimState.PREPARE_COMPLETED}
        answer = kubelet.unprepare(*(("default", name, uid) for name, (uid, _) in CLAIMS.items()))
        assert answer == {uid: "" for uid, _ in CLAIMS.values()}
        assert dirs.checkpoint().claims == {}


def newer(path: Path, key: str = "version") -> None:
    """Rewrite the JSON document (or a journal's first line) at `path` as a newer release would label it."""
    head, _, rest = path.read_text().partition("\n")
    document = json.loads(head)
    document[key] = CHECKPOINT_VERSION + 1
    path.write_text(json.dumps(document) + ("\n" + rest if rest or path.suffix == ".journal" else ""))


def test_an_agent_refuses_a_checkpoint_of_a_newer_format_with_one_line_and_changes_nothing(
    dirs: PluginDirs, tmp_path: Path
) -> None:
    kubeconfig = unreachable_kubeconfig(tmp_path / "kubeconfig")
    for damaged in ("checkpoint.json", "checkpoint.json.journal"):
        install(dirs)
        newer(dirs.state_dir / damaged)
        before = {p.name: p.read_bytes() for p in dirs.state_dir.iterdir() if p.is_file()}
        agent = AgentProcess(
            dirs, kubeconfig, settings={"DRA_GPU_GPU_BACKEND": f"simulated:{EVERY_MODE_PROFILE}"}
        )
        agent.start()
        assert agent.process is not None and agent.process.wait(60) == 3, agent.log()
        errors = [line for line in agent.log().splitlines() if line.startswith("error:")]
        assert errors == [
            f"error: cannot start the kubelet plugin: {dirs.state_dir / damaged} was written by a newer dra-gpu "
            f"(checkpoint format {CHECKPOINT_VERSION + 1}; release {__version__} reads formats 1, 2): nothing was "
            f"changed; run a release that reads it (docs/upgrades.md)"
        ]
        after = {p.name: p.read_bytes() for p in dirs.state_dir.iterdir() if p.is_file()}
        assert after == before, "the newer release's files were changed or set aside"
        assert not dirs.registration_socket.exists()
