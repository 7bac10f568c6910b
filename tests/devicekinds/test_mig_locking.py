"""Dynamic MIG: creating and destroying instances on one GPU never interleave.

A prepared dynamic instance is locked by its own MIG UUID at unprepare, while a prepare on the same
GPU locks the parent's UUID: without the per-GPU MIG lock their `nvidia-smi mig` calls could run
in between each other (and a create, which finds its instance as the new UUID in `nvidia-smi -L`,
could take the other's).
"""

from __future__ import annotations

import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from plugin_harness import gpu_config

from dra_gpu.config import parse_gpu_config
from dra_gpu.devicekinds import MakerHost
from dra_gpu.devicekinds.mig import mig_views
from dra_gpu.devicekinds.mig_instances import MigInstances
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import GpuInfo, SimulatedInventory
from dra_gpu.inventory.mig import MigInstance
from dra_gpu.inventory.mig_profiles import MigProfile
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.locking import KeyLocks, NodeLock
from dra_gpu.plugin.sharing.plan import ClaimInfo, Share


class SlowRecordingCommands:
    """The simulated driver, each MIG call taking a while and logged as (thread, call, begin/end)."""

    def __init__(self, inner: SimulatedCommands) -> None:
        self.inner = inner
        self.log: list[tuple[str, str, str]] = []
        self._guard = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _call(self, what: str, fn: Any) -> Any:
        me = threading.current_thread().name
        with self._guard:
            self.log.append((me, what, "begin"))
        time.sleep(0.05)
        try:
            return fn()
        finally:
            with self._guard:
                self.log.append((me, what, "end"))

    def mig_instances(self, gpu: GpuInfo) -> list[MigInstance]:
        result: list[MigInstance] = self._call("list", lambda: self.inner.mig_instances(gpu))
        return result

    def create_mig_instance(self, gpu: GpuInfo, profile: MigProfile, start: int) -> MigInstance:
        result: MigInstance = self._call(
            "create", lambda: self.inner.create_mig_instance(gpu, profile, start)
        )
        return result

    def destroy_mig_instance(self, gpu: GpuInfo, instance: MigInstance) -> None:
        self._call("destroy", lambda: self.inner.destroy_mig_instance(gpu, instance))


def share_of(device: str, gpu: GpuInfo) -> Share:
    return Share(
        position=0,
        request="mig",
        pool="node",
        device=device,
        gpu=gpu,
        share_id=None,
        consumed={"memory": Fraction(1)},
        admin_access=False,
        config=parse_gpu_config(gpu_config("Exclusive")),
    )


def claim(name: str) -> ClaimInfo:
    return ClaimInfo(uid=f"uid-{name}", namespace="default", name=name)


def runs(log: list[tuple[str, str, str]]) -> list[str]:
    """The threads in the order their blocks of calls ran: one entry per uninterrupted block."""
    out: list[str] = []
    for thread, _, _ in log:
        if not out or out[-1] != thread:
            out.append(thread)
    return out


@pytest.fixture
def setup(tmp_path: Path) -> tuple[MigInstances, SlowRecordingCommands, list[GpuInfo], dict[str, GpuInfo]]:
    gpus = SimulatedInventory("1xH100-80GB:mig", seed="node").gpus()
    commands = SlowRecordingCommands(SimulatedCommands(state_file=tmp_path / "simulated.json"))
    lock = NodeLock(tmp_path / "serialize.lock")
    host = MakerHost(
        state_dir=tmp_path,
        commands=commands,
        lock=lock,
        locks=lambda name: KeyLocks(lock.path.parent / name, lock.timeout_s),
        hook=lambda _step: None,
        api=FakeKube(),
    )
    mig = MigInstances(host)
    return mig, commands, gpus, mig_views(gpus)[0]


@pytest.mark.parametrize("other", ["prepare", "unprepare"])
def test_two_calls_on_one_gpu_never_interleave_their_mig_commands(setup, other: str) -> None:
    mig, commands, gpus, views = setup
    old = "gpu-0-mig-1g10gb-0"
    mig.materialize(claim("old"), [share_of(old, views[old])], gpus)
    commands.log.clear()

    new = "gpu-0-mig-3g40gb-4"
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def prepare_new() -> None:
        barrier.wait()
        mig.materialize(claim("new"), [share_of(new, views[new])], gpus)

    def second() -> None:
        barrier.wait()
        if other == "unprepare":
            mig.release("uid-old", gpus)
        else:
            mig.materialize(
                claim("third"), [share_of("gpu-0-mig-2g20gb-2", views["gpu-0-mig-2g20gb-2"])], gpus
            )

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        return run

    threads = [
        threading.Thread(target=guarded(prepare_new), name="prepare"),
        threading.Thread(target=guarded(second), name=f"second-{other}"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert sorted(runs(commands.log)) == ["prepare", f"second-{other}"], commands.log
    made = {(i.profile, i.start) for i in commands.inner.mig_instances(gpus[0])}
    expected = {("3g.40gb", 4)} | ({("1g.10gb", 0), ("2g.20gb", 2)} if other == "prepare" else set())
    assert made == expected
