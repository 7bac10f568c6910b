"""The node side of the container tests: the native limiter's outputs and the kubelet plugin.

The plugin runs in-process on real unix sockets against the in-memory API fake (there is no API
server here) with simulated GPUs; the test acts as the kubelet over gRPC. Its specs go to the
runtime's dynamic CDI directory, so the plugin runs under a driver name of its own: a host that runs
the real driver keeps its spec files, and a spec a crashed run left behind is removed by the next
run's plugin (which finds it on disk and not in its API).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from container_support import REPO_ROOT, RUNTIME_CDI_DIR, Volume

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # plugin_harness lives in tests/

from plugin_harness import Alloc, Kubelet, PluginDirs, add_claim, cdi_ids, opaque, running_plugin

from dra_gpu.host.gpu_commands import GpuCommands
from dra_gpu.inventory import GpuInfo, SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin.cdi_specs import ClaimSpecs
from dra_gpu.plugin.preparer_core import device_name

TEST_DRIVER = "container-test.gpu.dra-gpu.io"
NODE = "node-1"
PROFILE = "2xH100-80GB"

LIMITER_BUILD = REPO_ROOT / "native" / "limiter" / "build"
CONTAINER_LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
CONTAINER_LIBNVML = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
CONTAINER_PROBE = "/usr/local/bin/limiter-probe"


@dataclass(frozen=True)
class Limiter:
    """What ``make -C native/limiter`` builds (real paths, not the build's symlinks)."""

    library: Path
    fake_libcuda: Path
    probe: Path

    @classmethod
    def in_build(cls, build: Path = LIMITER_BUILD) -> Limiter:
        return cls(build / "libdragpu-limiter.so.1", build / "fake" / "libcuda.so.1", build / "limiter-probe")

    def resolved(self) -> Limiter:
        return Limiter(self.library.resolve(), self.fake_libcuda.resolve(), self.probe.resolve())

    def driver_stand_in(self) -> list[Volume]:
        """The fake CUDA driver and NVML where the loader finds libcuda.so.1 and libnvidia-ml.so.1, and the
        probe that uses them.

        On a GPU node the NVIDIA toolkit injects the real driver's libraries; these mounts are their
        stand-in. The limiter measures a new context through NVML (no context yet to ask the driver).
        """
        fake_nvml = self.fake_libcuda.with_name("libnvidia-ml.so.1").resolve()
        return [
            Volume(self.fake_libcuda, CONTAINER_LIBCUDA),
            Volume(fake_nvml, CONTAINER_LIBNVML),
            Volume(self.probe, CONTAINER_PROBE),
        ]


def make_device_nodes(root: Path, minors: tuple[int, ...]) -> None:
    """`<root>/dev/nvidia<minor>` and the common nodes as character devices 1:3 (what /dev/null is):
    a runtime creates them in a container as it would the real ones."""
    dev = root / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    for name in [f"nvidia{m}" for m in minors] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
        path = dev / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


@dataclass
class Node:
    """The plugin on this node, and the kubelet's side of its sockets."""

    dirs: PluginDirs
    api: FakeKube
    kubelet: Kubelet
    gpus: dict[str, GpuInfo]
    prepared: dict[str, dict[str, Any]] = field(default_factory=dict)

    def prepare(
        self, name: str, allocs: list[Alloc], strategy_config: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        """Create, allocate and prepare a claim as scheduler and kubelet do; its CDI ids."""
        allocs = [replace(a, driver=TEST_DRIVER, pool=NODE) for a in allocs]
        claim = add_claim(self.api, name, allocs, [opaque(strategy_config, driver=TEST_DRIVER)])
        uid = claim["metadata"]["uid"]
        response = self.kubelet.prepare(claim)[uid]
        assert response.error == "", response.error
        self.prepared[uid] = claim
        return claim, cdi_ids(response)

    def unprepare(self, claim: dict[str, Any]) -> None:
        uid = claim["metadata"]["uid"]
        assert self.kubelet.unprepare(claim) == {uid: ""}
        self.prepared.pop(uid, None)

    def unprepare_all(self) -> None:
        for claim in list(self.prepared.values()):
            self.unprepare(claim)

    def claim_dir(self, claim: dict[str, Any]) -> Path:
        return self.dirs.state_dir / "claims" / claim["metadata"]["uid"]


@contextmanager
def plugin_node(
    limiter: Limiter,
    cdi_dir: Path = RUNTIME_CDI_DIR,
    profile: str = PROFILE,
    commands: GpuCommands | None = None,
    **config: Any,
) -> Iterator[Node]:
    """A registered plugin writing its specs to ``cdi_dir``; its spec files are gone afterwards.

    ``config`` overrides PluginConfig fields (e.g. ``dev_root``, ``driver_root``, ``nvidia_ctk_dirs``).
    """
    dirs = PluginDirs.create(with_limiter=False)
    specs = ClaimSpecs(cdi_dir, TEST_DRIVER)
    inventory = SimulatedInventory(profile, seed=NODE)
    api = FakeKube()
    try:
        settings: dict[str, Any] = {
            "nvidia_ctk_dirs": (dirs.ctk_dir,),
            "dev_root": Path("/"),  # the real host: simulated GPUs have no /dev/nvidia* here
            "limiter_library": limiter.library,
            **config,
        }
        with running_plugin(
            dirs,
            api,
            inventory=inventory,
            commands=commands,
            driver_name=TEST_DRIVER,
            node_name=NODE,
            cdi_dir=cdi_dir,
            **settings,
        ):
            kubelet = Kubelet(dirs.registration_dir, driver=TEST_DRIVER)
            kubelet.register()
            try:
                yield Node(dirs, api, kubelet, {device_name(g): g for g in inventory.gpus()})
            finally:
                kubelet.close()
    finally:
        for uid in specs.uids_on_disk():
            specs.remove(uid)
        dirs.cleanup()
