"""The demo's MIG step: a second simulated node with two H100s in MIG mode, under the same API server.

GPU 0 is dynamic: the node agent publishes its counter set and a device per valid placement, and
makes the instance at prepare (a `3g.40gb` for one claim) and destroys it at unprepare. GPU 1 has
seven static `1g.10gb` instances in `Shared` mode: two limiter claims share the one at slice 0,
each limited by the instance's MIG UUID. The claims select by attribute, as a user's would; the
scheduler stand-in, the kubelet stand-in and the CDI resolver are the ones of the other steps.
The node's device root gets empty stand-ins for `/dev/nvidia*` and `/dev/nvidia-caps/*`, so that the
containers show the capability nodes of their instance (numbered from the simulated mig-minors).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdi.resolver import Registry
from dra_gpu import DRIVER_NAME
from dra_gpu.config import NodeSharing
from dra_gpu.demo.kubelet import KubeletStandIn
from dra_gpu.demo.node_dirs import node_agent_config
from dra_gpu.demo.report import ContainerView, render_table
from dra_gpu.demo.scheduler import SchedulerStandIn
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import open_inventory
from dra_gpu.kube import builders, objects
from dra_gpu.kube.fake import FakeKube
from dra_gpu.node_agent import NodeAgent
from dra_gpu.quantity import format_quantity

Obj = dict[str, Any]

MIG_NODE = "demo-mig-node"
MIG_PROFILE = "1xH100-80GB:mig,1xH100-80GB:mig=1g.10gb*7"
MIG_SHARING = "0=Exclusive,1=Shared"
_ATTR = f'device.attributes["{DRIVER_NAME}"]'
_SLICE_0_1G = f'has({_ATTR}.profile) && {_ATTR}.profile == "1g.10gb" && {_ATTR}.placementStart == 0'
"""The limiter class also selects whole GPUs, which have no `profile`: `has()` first, as a user must."""


@dataclass(frozen=True)
class MigClaimPlan:
    name: str
    device_class: str
    selector: str
    capacity: dict[str, str] | None
    pod: str
    what: str


MIG_CLAIMS = (
    MigClaimPlan(
        "mig-3g",
        f"mig.{DRIVER_NAME}",
        f'{_ATTR}.profile == "3g.40gb"',
        None,
        "mig-trainer",
        "a 3g.40gb instance, made at prepare on the dynamic GPU",
    ),
    MigClaimPlan(
        "mig-small-a",
        f"limiter.{DRIVER_NAME}",
        _SLICE_0_1G,
        {"memory": "4Gi", "cores": "50"},
        "mig-infer-a",
        "limiter share of the static 1g.10gb at slice 0",
    ),
    MigClaimPlan(
        "mig-small-b",
        f"limiter.{DRIVER_NAME}",
        _SLICE_0_1G,
        {"memory": "4Gi", "cores": "50"},
        "mig-infer-b",
        "limiter share of the same instance",
    ),
)


@dataclass
class MigHolder:
    claim: str
    device: str
    mig_uuid: str
    """The instance the container got (`DRAGPU_DEVICE_<device>`), "" if the prepare failed."""
    limit: str
    """The `device=` line of the claim's limiter limits file ("" for an Exclusive instance)."""
    caps: list[str]
    """The instance's `/dev/nvidia-caps` nodes the container gets."""


@dataclass
class MigReport:
    placements: int = 0
    """Dynamic devices published for GPU 0 (every valid placement of every profile)."""
    counter_set: str = ""
    static: list[str] = field(default_factory=list)
    holders: list[MigHolder] = field(default_factory=list)
    containers: list[ContainerView] = field(default_factory=list)
    made: list[str] = field(default_factory=list)
    """The MIG commands the node agent ran (simulated nvidia-smi)."""
    left_after_unprepare: list[str] = field(default_factory=list)
    """Instances on the dynamic GPU after every claim was unprepared."""
    errors: dict[str, str] = field(default_factory=dict)


def run_mig_step(line: Callable[[str], None], api: FakeKube, workdir: Path, library: Path) -> MigReport:
    """Publish, schedule, prepare and unprepare the MIG claims; print what each step shows."""
    report = MigReport()
    config = node_agent_config(MIG_NODE, workdir / "mig", library)
    _device_nodes(config.dev_root / "dev")
    api.create("Node", builders.node(MIG_NODE))
    inventory = open_inventory(f"simulated:{MIG_PROFILE}", seed=MIG_NODE)
    dynamic_gpu = inventory.gpus()[0]
    commands = SimulatedCommands(state_file=config.state_dir / "simulated-gpus.json")
    agent = NodeAgent(
        config, api, inventory, commands, sharing=NodeSharing.parse(MIG_SHARING), publish_slices=True
    )
    agent.start()
    kubelet: KubeletStandIn | None = None
    prepared: list[list[Obj]] = []
    try:
        _published(line, report, _wait_for_mig_slices(api))
        for plan in MIG_CLAIMS:
            api.create(
                "ResourceClaim",
                builders.claim(
                    plan.name,
                    plan.device_class,
                    namespace="demo",
                    capacity=plan.capacity,
                    selectors=[plan.selector],
                ),
            )
            api.create("Pod", builders.pod(plan.pod, [plan.name], namespace="demo"))
        scheduled = SchedulerStandIn(api).schedule()
        report.errors.update({f"schedule/{p}": why for p, why in scheduled.pending.items()})
        kubelet = KubeletStandIn(config.registration_socket)
        kubelet.register()
        claims = {objects.name(c): c for c in api.list("ResourceClaim", "demo")[0]}
        rows = []
        for plan in MIG_CLAIMS:
            used = [claims[plan.name]]
            answers = kubelet.prepare(used)
            prepared.append(used)
            ids = [i for a in answers.values() for d in a.devices for i in d.cdi_ids]
            devices = [d.device for a in answers.values() for d in a.devices]
            for answer in answers.values():
                if answer.error:
                    report.errors[plan.name] = answer.error
            if not ids:
                continue
            view = ContainerView.of(plan.pod, [plan.name], ids, Registry.load([config.cdi_dir]).resolve(ids))
            report.containers.append(view)
            holder = _holder(plan.name, devices[0], view)
            report.holders.append(holder)
            rows.append(
                (
                    plan.name,
                    plan.pod,
                    holder.device,
                    holder.mig_uuid,
                    _limit_text(holder.limit),
                    ", ".join(holder.caps),
                )
            )
        report.made = [" ".join(c) for c in commands.calls if c[0].endswith("mig_instance")]
        line(
            "claims (selecting by attribute) and what their containers get from the CDI specs:\n"
            + render_table(
                ("CLAIM", "POD", "DEVICE", "MIG UUID", "LIMITER", "CAPABILITY NODES"), rows, indent="  "
            )
        )
        line("MIG commands the node agent ran at prepare (simulated nvidia-smi mig):")
        for call in report.made:
            line(f"  {call}")
    finally:
        if kubelet is not None:
            for used in prepared:
                for uid, error in kubelet.unprepare(used).items():
                    if error:
                        report.errors[f"unprepare/{uid}"] = error
            kubelet.close()
        report.left_after_unprepare = [i.uuid for i in commands.mig_instances(dynamic_gpu)]
        agent.stop(grace_s=0.5)
        inventory.close()
    destroyed = [" ".join(c) for c in commands.calls if c[0] == "destroy_mig_instance"]
    line(
        f"after unprepare: {len(destroyed)} instance destroyed on the dynamic GPU, "
        f"{len(report.left_after_unprepare)} left; the static instances stay"
    )
    return report


def _published(line: Callable[[str], None], report: MigReport, slices: list[Obj]) -> None:
    devices = [d for s in slices for d in objects.slice_devices(s)]
    sets = [c for s in slices for c in objects.shared_counters(s)]
    report.counter_set = sets[0]["name"] if sets else ""
    report.placements = sum(1 for d in devices if d["attributes"].get("migDynamic", {}).get("bool"))
    report.static = [d["name"] for d in devices if not d["attributes"].get("migDynamic", {}).get("bool")]
    line(f"node {MIG_NODE}: {MIG_PROFILE}, sharing {MIG_SHARING}")
    line(
        f"  GPU 0 (dynamic): counter set {report.counter_set} (8 memory slices and the engines) in a slice "
        f"of its own, {report.placements} placements consuming from it"
    )
    line(f"  GPU 1 (static, Shared): {len(report.static)} instances, {', '.join(report.static[:2])}, ...")


def _holder(claim: str, device: str, view: ContainerView) -> MigHolder:
    key = "DRAGPU_DEVICE_" + "".join(c if c.isalnum() else "_" for c in device).upper()
    limits = next((Path(src) for dst, src, _ in view.mounts if dst.endswith("/limits")), None)
    lines = limits.read_text().splitlines() if limits is not None and limits.is_file() else []
    return MigHolder(
        claim=claim,
        device=device,
        mig_uuid=view.env.get(key, ""),
        limit=next((line for line in lines if line.startswith("device=")), ""),
        caps=[n for n in view.device_nodes if n.startswith("/dev/nvidia-caps/")],
    )


def _limit_text(line: str) -> str:
    """`device=MIG-... memory=4294967296 cores=50` as `4Gi, 50 % of MIG-...`."""
    if not line:
        return "none (whole instance)"
    fields = dict(part.split("=", 1) for part in line.split())
    memory = fields.get("memory", "unlimited")
    shown = format_quantity(int(memory)) if memory.isdigit() else memory
    return f"{shown}, {fields.get('cores', '100')} % of {fields.get('device', '?')[:12]}..."


def _device_nodes(dev: Path) -> None:
    """Empty stand-ins for the nodes a MIG container gets: the GPUs', the control ones, the capabilities."""
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).touch()
    for minor in range(1, 3 + 2 * 135):
        (dev / "nvidia-caps" / f"nvidia-cap{minor}").touch()


def _wait_for_mig_slices(api: FakeKube, timeout_s: float = 20.0) -> list[Obj]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items = [s for s in api.list("ResourceSlice")[0] if objects.slice_node(s) == MIG_NODE]
        if any(objects.shared_counters(s) for s in items) and any(objects.slice_devices(s) for s in items):
            return items
        time.sleep(0.02)
    raise RuntimeError("the MIG node's agent did not publish its ResourceSlices")
