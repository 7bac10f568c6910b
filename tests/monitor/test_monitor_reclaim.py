"""A claim shared by pods in separate PID namespaces gets back what an exited process held.

The library frees a slot of its claim's region only for a process it can prove gone, which it cannot from
another PID namespace: each restarted pod would leave its memory charged for the claim's lifetime. The
node agent's monitor sees every process of the node and hands such slots back; the claim's next process
then refunds them. Real processes here: the limiter with the fake driver, in PID namespaces of their own
(`unshare --pid --fork --mount-proc`, as a container has its own /proc), against a region the agent made.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_gpu.limiter_abi.region import (
    REGION_FILE,
    SLOT_BYTES,
    SLOTS_AT,
    SlotOwner,
    hand_back,
    read_region,
    unlocked_slots,
)
from dra_gpu.monitor.process_owner import ProcReader
from dra_gpu.plugin.sharing.modes.limiter_region import make_region

MiB = 2**20
GiB = 2**30


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


needs_pid_namespaces = pytest.mark.skipif(
    not _can_unshare(), reason="needs root and unshare --pid (new PID namespaces)"
)


class Pod:
    """A limited process in a PID namespace of its own, as a pod's container runs it."""

    def __init__(self, built: Path, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                str(built / "limiter-probe"),
                *args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def wait_for(self, line: str) -> list[str]:
        assert self.proc.stdout is not None
        seen: list[str] = []
        for raw in self.proc.stdout:
            seen.append(raw.strip())
            if seen[-1] == line:
                return seen
        raise AssertionError(f"the probe ended without {line!r}: {seen}")

    def allocated(self) -> int:
        out, _ = self.proc.communicate(timeout=60)
        last = out.strip().splitlines()[-1]
        assert last.startswith("allocated="), out
        return int(last.split()[0].removeprefix("allocated="))

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # unshare and the probe in its namespace
        self.proc.wait()


@pytest.fixture
def claim_env(built: Path) -> Iterator[tuple[dict[str, str], object]]:
    """A prepared Limiter claim of 1 GiB (simulated GPUs, no NVML): the environment of its processes and
    the running plugin."""
    from plugin_harness import (
        PluginDirs,
        claim_process_env,
        prepared_container,
        running_plugin,
        share_claim,
    )

    from dra_gpu.kube.fake import FakeKube

    dirs = PluginDirs.create()
    api = FakeKube()
    claim = share_claim(
        api, "shared", device="gpu-1", memory="1Gi", cores="100", share=11, namespace="team-a"
    )
    try:
        with (
            running_plugin(dirs, api, monitor_interval_s=3600) as plugin,  # samples when the test says
            prepared_container(dirs, claim) as container,
        ):
            env = claim_process_env(built, container)
            # About slots, not contexts: a context of no size keeps the figures those of the allocations.
            env["FAKE_CUDA_CTX_BYTES"] = "0"
            yield env, plugin
    finally:
        dirs.cleanup()


@needs_pid_namespaces
def test_a_restarted_pod_gives_its_memory_back_after_the_agents_pass(
    built: Path, claim_env: tuple[dict[str, str], object]
) -> None:
    env, plugin = claim_env
    monitor = plugin.monitor  # type: ignore[attr-defined]
    first = Pod(built, env, "alloc", str(512 * MiB), "1", "--hold")
    second = Pod(built, env, "alloc", str(512 * MiB), "1", "--hold")
    try:
        first.wait_for("holding")
        second.wait_for("holding")
        second.kill()  # its pod restarts: a new PID namespace, where the old one's death cannot be proven
        # From a namespace that outlived it (a new one could reuse the dead one's inode number):
        leaked = subprocess.run(
            [str(built / "limiter-probe"), "alloc", str(512 * MiB), "1"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert leaked.stdout.splitlines()[-1] == "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY", (
            "the library alone cannot refund a process of another PID namespace"
        )

        monitor.sample_once()
        # The killed holder's slot, and the refused probe's unless its own namespace's sweep freed it first.
        reclaimed = monitor.slots_reclaimed.get(("team-a", "shared"), 0)
        assert 1 <= reclaimed <= 2

        restarted = Pod(built, env, "alloc", str(256 * MiB), "4")
        assert restarted.allocated() == 512 * MiB, "the claim has its budget back, and no more"
        monitor.sample_once()
        # At most the restarted pod's own slot: never the living holder's (checked below by what it holds).
        assert monitor.slots_reclaimed.get(("team-a", "shared"), 0) - reclaimed <= 1
        (device,) = read_region(Path(env["DRAGPU_LIMITER_STATE_DIR"])) or []
        assert device.used_bytes == 512 * MiB
        again = Pod(built, env, "alloc", str(256 * MiB), "4")
        assert again.allocated() == 512 * MiB, "what the living holder holds stays charged"
    finally:
        first.kill()
        second.kill()


def _fake_slot(region: Path, slot: int, owner: SlotOwner, used: int) -> None:
    with open(region, "r+b") as f:
        f.seek(SLOTS_AT + slot * SLOT_BYTES)
        f.write(struct.pack("=IiQQq", 1, owner.pid, owner.pidns, owner.start, used))


def _myself() -> SlotOwner:
    start = ProcReader().start_time(os.getpid())
    assert start is not None
    return SlotOwner(os.stat("/proc/self/ns/pid").st_ino, os.getpid(), start)


def test_a_live_process_whose_slot_lock_is_free_is_never_handed_back(tmp_path: Path) -> None:
    """A tenant can drop its own slot's lock: only a process gone from the whole node is handed back."""
    region = tmp_path / REGION_FILE
    assert make_region(region)
    me = _myself()
    gone = SlotOwner(me.pidns, me.pid, me.start + 1)  # a process that had this PID before
    _fake_slot(region, 0, me, 256 * MiB)
    _fake_slot(region, 1, gone, 256 * MiB)
    slots = unlocked_slots(tmp_path)
    assert slots == [(0, me), (1, gone)]
    index = ProcReader().process_index()
    assert index.alive(me) is True
    assert index.alive(gone) is False
    assert hand_back(tmp_path, [s for s in slots if index.alive(s[1]) is False]) == 1
    assert unlocked_slots(tmp_path) == [(0, me)], "the live process keeps its slot"


def test_a_slot_claimed_again_meanwhile_is_not_handed_back(tmp_path: Path) -> None:
    region = tmp_path / REGION_FILE
    assert make_region(region)
    me = _myself()
    old = SlotOwner(me.pidns, me.pid, me.start + 1)
    _fake_slot(region, 0, old, 256 * MiB)
    (candidate,) = unlocked_slots(tmp_path)
    _fake_slot(region, 0, me, 0)  # another process took the slot between the read and the hand-back
    assert hand_back(tmp_path, [candidate]) == 0


def test_a_process_of_which_nothing_can_be_read_is_never_taken_for_gone(tmp_path: Path) -> None:
    """A proc root with a process whose namespace cannot be read: the index is unsure, not sure it is gone."""
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "stat").write_text("4242 (app) S 1 4242 4242 0 -1 4194560 " + "0 " * 12 + "777 0\n")
    index = ProcReader(tmp_path).process_index()
    assert index.alive(SlotOwner(1, 7, 777)) is None
    assert index.alive(SlotOwner(1, 7, 778)) is False
