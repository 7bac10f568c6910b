"""Device access for every share: the GPU's device nodes, and the driver's files where nothing else brings them.

Where the host has the NVIDIA Container Toolkit's generated spec (kind ``nvidia.com/gpu``) and it
names the GPU, its device carries the device nodes, driver libraries and hooks, so we return its id
beside ours and add no nodes. Otherwise our spec lists the device nodes that exist on the host (a
runtime refuses the whole container for a node that does not exist, and simulated GPUs have none)
and brings the driver's user-space files. Which nodes and files are the device's kind's to say
(`DeviceKind.device_nodes`, `driver_nodes`, `driver_files`: for NVIDIA's kinds each device's
``/dev/nvidia<minor>`` (and a MIG instance's capability nodes), the driver's control and UVM nodes, and
the files found under the node's driver root, of exactly the driver version NVML reports: ``libcuda``, NVML, the PTX JIT, the GPU compiler, NVVM, the debugger back
end and ``nvidia-smi``; never the MPS programs (``AGENT_ONLY_TOOLS``). The libraries are mounted into ``DRIVER_LIB_DIR``,
which an ``/etc/ld.so.conf.d`` entry names and a ``createContainer`` hook adds to the container's
loader cache (``driver_root.install_ldcache_hook``), so the loader finds them without
``LD_LIBRARY_PATH``.

A container sees exactly the GPUs of the CDI devices it was given: each device brings its own GPU's
device node, and nothing names GPUs claim-wide. ``NVIDIA_VISIBLE_DEVICES`` is ``void`` (as in the
toolkit's own spec), so a legacy NVIDIA runtime hook adds nothing, whatever claims and requests a
container uses. ``DRAGPU_DEVICE_<device>`` names each device's GPU UUID (one variable per device,
so several claims or requests never overwrite each other).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from cdi.errors import CDIError
from cdi.files import SPEC_EXTENSIONS, read_spec
from cdi.spec import DeviceNode, Hook
from dra_gpu import devicekinds
from dra_gpu.host.driver_root import LDCACHE_HOOK, DriverFiles
from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin.errors import PrepareError
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share

log = logging.getLogger(__name__)

NVIDIA_CTK_KIND = "nvidia.com/gpu"
DRIVER_LIB_DIR = "/usr/local/lib/dra-gpu/driver"
DRIVER_BIN_DIR = "/usr/bin"
LDCONFIG_ENTRY = "/etc/ld.so.conf.d/dra-gpu-driver.conf"
HOOK_TIMEOUT_S = 30
AGENT_ONLY_TOOLS = frozenset({"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"})
"""The agent runs these; a container never gets them. An MPS client needs only the pipe directory and
libcuda, and a tenant with the control program could ``quit`` the daemon every MPS claim of the GPU uses."""


class NvidiaCtkSpecs:
    """Which GPUs the toolkit's spec defines; files are re-read only when they change."""

    def __init__(self, skip_prefix: str) -> None:
        self.skip_prefix = skip_prefix
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, set[str]]] = {}
        self.broken: dict[str, str] = {}
        """Spec files that do not parse, with the reason (logged once per change of the file)."""

    def device_names(self, dirs: Sequence[Path]) -> set[str]:
        names: set[str] = set()
        with self._lock:
            seen: set[str] = set()
            for directory in dirs:
                try:
                    entries = list(os.scandir(directory))
                except (FileNotFoundError, NotADirectoryError, PermissionError):
                    continue
                for entry in entries:
                    if (
                        entry.name.startswith((".", self.skip_prefix))
                        or Path(entry.name).suffix not in SPEC_EXTENSIONS
                    ):
                        continue
                    seen.add(entry.path)
                    names |= self._names_in(entry)
            for stale in set(self._files) - seen:
                del self._files[stale]
                self.broken.pop(stale, None)
        return names

    def _names_in(self, entry: os.DirEntry[str]) -> set[str]:
        try:
            mtime = entry.stat().st_mtime_ns
        except OSError:
            return set()
        cached = self._files.get(entry.path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            spec = read_spec(Path(entry.path))
            found = {d.name for d in spec.devices} if spec.kind == NVIDIA_CTK_KIND else set()
            self.broken.pop(entry.path, None)
        except CDIError as exc:
            found = set()
            self.broken[entry.path] = str(exc)
            log.error(
                "a CDI spec file does not parse: container runtimes skip it, so the GPUs it should bring "
                "get this driver's device nodes and the driver's files from the driver root instead; "
                "regenerate it (nvidia-ctk cdi generate)",
                extra={"path": entry.path, "error": str(exc)},
            )
        self._files[entry.path] = (mtime, found)
        return found


def ctk_device_name(gpu: GpuInfo, available: set[str]) -> str | None:
    """The first of the names its kind says the toolkit may give the device that the toolkit's spec has."""
    return next((n for n in devicekinds.kind_of(gpu).toolkit_names(gpu) if n in available), None)


DEVICE_ENV_PREFIX = "DRAGPU_DEVICE_"


def env_key(device: str) -> str:
    return DEVICE_ENV_PREFIX + "".join(c if c.isalnum() else "_" for c in device.upper())


def device_uuids(env: Mapping[str, str]) -> list[str]:
    """The GPUs a container with this CDI environment was given, in order: what its device nodes let
    CUDA see. For running a claim's process outside a container (the demo, gpu-check), where
    ``CUDA_VISIBLE_DEVICES`` must stand in for the device nodes."""
    found: list[str] = []
    for key, value in env.items():
        if key.startswith(DEVICE_ENV_PREFIX) and not key.endswith("_SHARE_ID") and value not in found:
            found.append(value)
    return found


class DeviceAccess:
    name = "device-access"
    order = 0

    def __init__(self) -> None:
        self._ctk: dict[str, NvidiaCtkSpecs] = {}

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        return None

    def _host_node(self, node: NodeContext, container_path: str) -> DeviceNode | None:
        root = str(node.dev_root)
        host = os.path.join(root, container_path.lstrip("/"))
        if not os.path.exists(host):
            return None
        return DeviceNode(path=container_path, host_path=None if root == "/" else host)

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        ctk = self._ctk.setdefault(node.driver, NvidiaCtkSpecs(skip_prefix=f"{node.driver}-"))
        available = ctk.device_names(node.nvidia_ctk_dirs) if node.nvidia_ctk_dirs else set()
        for path, reason in sorted(ctk.broken.items()):
            plan.notice(
                f"the NVIDIA Container Toolkit's CDI spec {path} does not parse ({reason}); this claim's "
                f"containers get the driver's files from the node's driver root instead"
            )
        by_kind: dict[str, devicekinds.DeviceKind] = {}
        for share in plan.shares:
            edits = plan.edits(share)
            repeated = any(s.device == share.device and s.position < share.position for s in plan.shares)
            key = env_key(share.device) + (f"_{share.position}" if repeated else "")
            edits.env[key] = share.gpu.uuid
            if share.share_id:
                edits.env[f"{key}_SHARE_ID"] = share.share_id
            ctk_name = ctk_device_name(share.gpu, available)
            if ctk_name is not None:
                plan.extra_cdi_ids.setdefault(share.position, []).append(f"{NVIDIA_CTK_KIND}={ctk_name}")
                continue
            kind = devicekinds.kind_of(share.gpu)
            by_kind.setdefault(kind.name, kind)
            try:
                paths = kind.device_nodes(share.gpu, node.commands)
            except devicekinds.DeviceNodeError as exc:
                raise PrepareError(str(exc), reason="setup_failed") from None
            for path in paths:
                device_node = self._host_node(node, path)
                if device_node is not None:
                    edits.add_device_node(device_node)
        for path in dict.fromkeys(p for kind in by_kind.values() for p in kind.driver_nodes()):
            common = self._host_node(node, path)
            if common is not None:
                plan.claim_edits.add_device_node(common)
        if by_kind:
            self._driver_files(plan, node, list(by_kind.values()))
        # The same value in every spec: no claim or request can overwrite another's visibility.
        plan.claim_edits.env["NVIDIA_VISIBLE_DEVICES"] = "void"

    @staticmethod
    def _driver_files(plan: Plan, node: NodeContext, kinds: Sequence[devicekinds.DeviceKind]) -> None:
        """The driver's libraries and tools its kinds name, and the loader told where they are."""
        libraries: dict[Path, None] = {}
        executables: dict[Path, None] = {}
        for kind in kinds:
            views = [share.gpu for share in plan.shares if devicekinds.kind_of(share.gpu) is kind]
            found = kind.driver_files(views, node.driver_files)
            libraries.update(dict.fromkeys(found.libraries))
            executables.update(dict.fromkeys(found.executables))
        files = DriverFiles(libraries=tuple(libraries), executables=tuple(executables))
        if not files.libraries and not files.executables:
            return  # simulated GPUs, or a node whose driver the runtime brings some other way
        host_root = node.driver_root_host_path or node.driver_root
        edits = plan.claim_edits
        for rel in files.libraries:
            edits.add_mount(
                host_root / rel, f"{DRIVER_LIB_DIR}/{rel.name}", ["ro", "nosuid", "nodev", "bind"]
            )
        for rel in files.executables:
            if rel.name in AGENT_ONLY_TOOLS:
                continue
            edits.add_mount(
                host_root / rel, f"{DRIVER_BIN_DIR}/{rel.name}", ["ro", "nosuid", "nodev", "bind"]
            )
        if not files.libraries:
            return
        entry = node.claim_dir(plan.claim.uid) / "ld.so.conf"
        plan.hold("file", f"file:{entry}", path=str(entry), content=DRIVER_LIB_DIR + "\n", mode=0o444)
        edits.add_mount(entry, LDCONFIG_ENTRY, ["ro", "nosuid", "nodev", "bind"])
        if node.ldcache_hook is None:
            plan.notice(
                f"the driver's libraries are mounted at {DRIVER_LIB_DIR}, but this node agent has no "
                f"loader-cache hook installed; a workload finds libcuda only after running ldconfig itself"
            )
            return
        edits.hooks.append(
            Hook(
                hook_name="createContainer",
                path=str(node.ldcache_hook),
                args=[LDCACHE_HOOK, DRIVER_LIB_DIR],
                timeout=HOOK_TIMEOUT_S,
            )
        )


BACKEND = DeviceAccess()
