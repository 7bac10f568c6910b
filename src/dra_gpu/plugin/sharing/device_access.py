"""Device access for every share: the GPU's device nodes, or the NVIDIA Container Toolkit's CDI device.

Where the host has the toolkit's generated spec (kind ``nvidia.com/gpu``), its device carries the
device nodes, driver libraries and hooks, so we return its id beside ours and add no nodes. Otherwise
our spec lists the device nodes that exist on the host: a runtime refuses the whole container for a
node that does not exist, and simulated GPUs have none. Our spec always names exactly the claim's
GPUs in ``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` (claim-wide, in result order, so CUDA
ordinals follow the allocation).

Known limit: runtimes merge CDI environment variables last-wins, so a container that references
several claims of this driver (or one request of a claim whose requests are on different GPUs) gets
another claim's (or the whole claim's) GPU list in these variables, not the GPUs it was given.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

from cdi.errors import CDIError
from cdi.files import SPEC_EXTENSIONS, read_spec
from cdi.spec import DeviceNode
from dra_gpu.inventory import GpuInfo
from dra_gpu.plugin.sharing.plan import Holder, NodeContext, Plan, Share

NVIDIA_CTK_KIND = "nvidia.com/gpu"
COMMON_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class NvidiaCtkSpecs:
    """Which GPUs the toolkit's spec defines; files are re-read only when they change."""

    def __init__(self, skip_prefix: str) -> None:
        self.skip_prefix = skip_prefix
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, set[str]]] = {}

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
        except CDIError:
            found = set()
        self._files[entry.path] = (mtime, found)
        return found


def ctk_device_name(gpu: GpuInfo, available: set[str]) -> str | None:
    """The toolkit names a GPU by UUID and by index; prefer the UUID (indexes can change)."""
    for name in (gpu.uuid, str(gpu.index)):
        if name in available:
            return name
    return None


def env_key(device: str) -> str:
    return "DRAGPU_DEVICE_" + "".join(c if c.isalnum() else "_" for c in device.upper())


class DeviceAccess:
    name = "device-access"
    order = 0

    def __init__(self) -> None:
        self._ctk: dict[str, NvidiaCtkSpecs] = {}

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        return None

    def _host_node(self, node: NodeContext, container_path: str) -> DeviceNode | None:
        host = node.dev_root / container_path.lstrip("/")
        if not os.path.exists(host):
            return None
        same_path = node.dev_root == Path("/")
        return DeviceNode(path=container_path, host_path=None if same_path else str(host))

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        ctk = self._ctk.setdefault(node.driver, NvidiaCtkSpecs(skip_prefix=f"{node.driver}-"))
        available = ctk.device_names(node.nvidia_ctk_dirs) if node.nvidia_ctk_dirs else set()
        needs_common_nodes = False
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
            needs_common_nodes = True
            gpu_node = self._host_node(node, f"/dev/nvidia{share.gpu.minor}")
            if gpu_node is not None:
                edits.add_device_node(gpu_node)
        if needs_common_nodes:
            for path in COMMON_NODES:
                common = self._host_node(node, path)
                if common is not None:
                    plan.claim_edits.add_device_node(common)
        visible = ",".join(g.uuid for g in plan.visible_gpus())
        plan.claim_edits.env["NVIDIA_VISIBLE_DEVICES"] = visible
        plan.claim_edits.env["CUDA_VISIBLE_DEVICES"] = visible


BACKEND = DeviceAccess()
