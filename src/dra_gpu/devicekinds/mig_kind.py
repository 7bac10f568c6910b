"""The MIG instance kind (`MIG`): what `mig.py` publishes and what `mig_instances.py` makes at prepare,
behind the `DeviceKind` interface."""

from __future__ import annotations

from collections.abc import Sequence

from dra_gpu.config import GpuSharingMode
from dra_gpu.devicekinds.gpu import NVIDIA_DRIVER_NODES, nvidia_driver_files
from dra_gpu.devicekinds.kind import DeviceMaker, DriverFilesLookup, MakerHost, Obj, Publish
from dra_gpu.devicekinds.mig import (
    MIG_TYPE,
    capability_nodes,
    counter_set,
    mig_devices,
    mig_views,
    table_of,
    unpublished_instances,
)
from dra_gpu.devicekinds.mig_instances import MigInstances
from dra_gpu.host.driver_root import DriverFiles
from dra_gpu.host.gpu_commands import GpuCommands
from dra_gpu.inventory.types import GpuInfo


class MigInstanceKind:
    """A MIG instance of a GPU in MIG mode: existing ones (static) or every placement (dynamic)."""

    name: str = MIG_TYPE
    published_type: str | None = MIG_TYPE

    def published_mode(self, gpu: GpuInfo, configured: GpuSharingMode) -> GpuSharingMode:
        """A static instance takes the GPU's setting; a dynamic one exists for one claim only."""
        return GpuSharingMode.EXCLUSIVE if gpu.mig_dynamic else configured

    def devices(self, gpu: GpuInfo, publish: Publish) -> list[Obj] | None:
        return mig_devices(
            gpu,
            self.published_mode(gpu, publish.configured),
            consumable_capacity=publish.consumable_capacity,
            taints=publish.taints,
            counters=publish.counters,
        )

    def counter_sets(self, gpu: GpuInfo) -> list[Obj]:
        table = table_of(gpu) if gpu.mig_dynamic else None
        return [counter_set(gpu, table)] if table is not None else []

    def unpublished(self, gpu: GpuInfo) -> list[tuple[str, str]]:
        return [
            (f"mig:{instance.uuid}", f"MIG device {instance.uuid} is not published: {why}")
            for instance, why in unpublished_instances(gpu)
        ]

    def views(self, gpu: GpuInfo) -> dict[str, GpuInfo]:
        return mig_views([gpu])[0]

    def device_nodes(self, view: GpuInfo, commands: GpuCommands) -> list[str]:
        """The parent's node and the instance's capability nodes (never the `config` or `monitor` ones)."""
        return [f"/dev/nvidia{view.minor}", *capability_nodes(view, str(commands.mig_minors_file()))]

    def driver_nodes(self) -> tuple[str, ...]:
        return NVIDIA_DRIVER_NODES

    def driver_files(self, views: Sequence[GpuInfo], lookup: DriverFilesLookup) -> DriverFiles:
        return nvidia_driver_files(views, lookup)

    def maker(self, host: MakerHost) -> DeviceMaker | None:
        """The dynamic instances: made at prepare on their placement, destroyed at unprepare."""
        return MigInstances(host)

    def toolkit_names(self, view: GpuInfo) -> tuple[str, ...]:
        """Its MIG UUID only: the parent's index names the whole GPU."""
        return (view.uuid,)


MIG = MigInstanceKind()
