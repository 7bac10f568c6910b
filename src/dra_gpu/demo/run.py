"""The local demo: the whole driver on one machine with no cluster and no GPU.

Real: the node agent (`NodeAgent`) with its slice publisher, its gRPC services on unix sockets, its
CDI spec files and checkpoint; the allocator; the cluster controller's reconcile pass; the CDI resolver;
and, when built, the native limiter library in real processes (a cap, and elastic compute between two claims).
Simulated: the API server (`FakeKube`, in process), the GPUs (a simulated inventory), nvidia-smi and the
MPS control daemon (recorded, not run), the CUDA driver (the limiter's fake `libcuda`), and the
kube-scheduler and kubelet (stand-ins that make the same API writes and gRPC calls).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from cdi.resolver import Registry
from dra_gpu import DRIVER_NAME
from dra_gpu.config import NodeSharing, merge_configs
from dra_gpu.controller import Snapshot
from dra_gpu.controller.metrics import ControllerMetrics
from dra_gpu.controller.owned_classes import is_controller_managed, with_marker
from dra_gpu.controller.reconciler import Reconciler
from dra_gpu.demo.elastic_step import ELASTIC_NODE, ELASTIC_PROFILE, ElasticReport, run_elastic_step
from dra_gpu.demo.kubelet import KubeletStandIn, Prepared
from dra_gpu.demo.limiter_step import LimiterRun, find_limiter_build, limiter_library, run_limiter_probe
from dra_gpu.demo.mig_step import MIG_NODE, MIG_PROFILE, MigReport, run_mig_step
from dra_gpu.demo.node_dirs import node_agent_config
from dra_gpu.demo.report import (
    ContainerView,
    GpuHolder,
    GpuView,
    render_containers,
    render_gpus,
    render_table,
    share_text,
)
from dra_gpu.demo.scheduler import SchedulerStandIn
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import open_inventory
from dra_gpu.kube import builders, objects
from dra_gpu.kube.events import EventRecorder
from dra_gpu.kube.fake import FakeKube
from dra_gpu.manifests import load_values, render
from dra_gpu.node_agent import NodeAgent

Obj = dict[str, Any]

NODE = "demo-node"
NAMESPACE = "demo"
PROFILE = "4xH100-80GB"
SHARING = "0=Exclusive,1=Shared,2=Shared,3=MPS"
ANTI_AFFINITY_CLASS = f"antiaffinity.limiter.{DRIVER_NAME}"
ANTI_AFFINITY_LABEL = "app"

SIMULATED = (
    (
        "Kubernetes API server",
        "in-process fake with the real one's semantics (resource versions, 409s, finalizers)",
    ),
    (
        "GPUs",
        f"simulated inventory {PROFILE} on node {NODE}, {ELASTIC_PROFILE} on node {ELASTIC_NODE}, "
        f"{MIG_PROFILE} on node {MIG_NODE}",
    ),
    ("kube-scheduler", "stand-in: the real allocator and the scheduler's API writes, nothing else"),
    ("kubelet", "stand-in: registration and NodePrepareResources over the plugin's real gRPC sockets"),
    ("nvidia-smi, MPS control daemon", "recorded by the node agent, not run (MIG instances kept in a file)"),
    ("CUDA driver", "the limiter's fake libcuda, a simulated GPU per process (only for the limiter steps)"),
)
REAL = (
    "node agent: slice publisher, gRPC services on unix sockets, CDI spec files, checkpoint",
    "allocator and cluster controller (placement policies)",
    "CDI resolution of what each container receives",
    "the native limiter library in real processes, arbitrating elastic compute between them (when built)",
)


@dataclass
class PodPlan:
    name: str
    claims: list[str]
    what: str


@dataclass
class ClaimPlan:
    name: str
    device_class: str
    capacity: dict[str, str] | None = None
    labels: dict[str, str] | None = None


CLAIMS = (
    ClaimPlan("whole-gpu", DRIVER_NAME),
    ClaimPlan("limited", f"limiter.{DRIVER_NAME}", {"memory": "10Gi", "cores": "30"}),
    ClaimPlan("mps-share", f"mps.{DRIVER_NAME}", {"memory": "20Gi", "cores": "50"}),
    ClaimPlan("time-sliced", f"timeslice.{DRIVER_NAME}", {"memory": "8Gi", "cores": "20"}),
    ClaimPlan("team-share", f"limiter.{DRIVER_NAME}", {"memory": "16Gi", "cores": "40"}),
    ClaimPlan("web-0", ANTI_AFFINITY_CLASS, {"memory": "4Gi", "cores": "10"}, {ANTI_AFFINITY_LABEL: "web"}),
    ClaimPlan("web-1", ANTI_AFFINITY_CLASS, {"memory": "4Gi", "cores": "10"}, {ANTI_AFFINITY_LABEL: "web"}),
)
PODS = (
    PodPlan("trainer", ["whole-gpu"], "a whole GPU"),
    PodPlan("inference", ["limited"], "limiter share: 10 GiB and 30 % of one GPU, enforced"),
    PodPlan("mps-client", ["mps-share"], "MPS client share: 20 GiB pinned, 50 % active threads"),
    PodPlan("notebook", ["time-sliced"], "time-sliced share (accounting only, no isolation)"),
    PodPlan("team-0", ["team-share"], "one limiter claim shared by three pods"),
    PodPlan("team-1", ["team-share"], "one limiter claim shared by three pods"),
    PodPlan("team-2", ["team-share"], "one limiter claim shared by three pods"),
    PodPlan("web-0", ["web-0"], "anti-affinity (app=web): never on the GPU of web-1"),
    PodPlan("web-1", ["web-1"], "anti-affinity (app=web): never on the GPU of web-0"),
)


@dataclass
class DemoReport:
    gpus: list[GpuView] = field(default_factory=list)
    containers: list[ContainerView] = field(default_factory=list)
    first_round_pending: dict[str, str] = field(default_factory=dict)
    controller_allocated: dict[str, Obj] = field(default_factory=dict)
    bound: dict[str, str] = field(default_factory=dict)
    prepare_errors: dict[str, str] = field(default_factory=dict)
    gpu_commands: list[str] = field(default_factory=list)
    limiter: LimiterRun | None = None
    elastic: ElasticReport | None = None
    mig: MigReport | None = None
    workdir: Path | None = None


class DemoError(RuntimeError):
    """A step of the demo did not do what it should; the message says which."""


class _Out:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.step = 0

    def section(self, title: str) -> None:
        self.step += 1
        self.line(f"\n== {self.step}. {title} " + "=" * max(0, 76 - len(title)))

    def line(self, text: str = "") -> None:
        try:
            print(text, file=self.stream, flush=True)
        except BrokenPipeError:
            # The reader went away (`dra-gpu demo | head`): keep going quietly so the clean-up runs.
            if self.stream is sys.stdout:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            self.stream = io.StringIO()


@contextlib.contextmanager
def _quiet_logs(verbose: bool) -> Iterator[None]:
    """The components log at info; the demo's own output is the story, so only errors get through."""
    root = logging.getLogger()
    previous = root.level
    if not verbose:
        root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(previous)


def run_demo(
    stream: TextIO,
    *,
    limiter_build: Path | None = None,
    keep: bool = False,
    verbose: bool = False,
) -> DemoReport:
    """Run every step, print it to `stream`, and return what happened (for tests)."""
    out = _Out(stream)
    report = DemoReport()
    workdir = Path(tempfile.mkdtemp(prefix="dra-gpu-demo-"))
    report.workdir = workdir
    started = time.monotonic()
    try:
        with _quiet_logs(verbose):
            _run(out, report, workdir, limiter_build if limiter_build is not None else find_limiter_build())
    finally:
        if keep:
            out.line(f"\nFiles kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    out.line(f"\nDone in {time.monotonic() - started:.1f} s.")
    return report


def _run(out: _Out, report: DemoReport, workdir: Path, limiter_build: Path | None) -> None:
    out.line(
        "dra-gpu local demo: GPU sharing with Kubernetes DRA, on this machine, without a cluster or a GPU."
    )
    out.line("\nSimulated here (and what stands in for it):")
    out.line(render_table(("PART", "STAND-IN"), SIMULATED, indent="  "))
    out.line("\nReal here:")
    for item in REAL:
        out.line(f"  - {item}")

    api = FakeKube()
    api.create("Node", builders.node(NODE))
    library = limiter_library(limiter_build, workdir)
    config = node_agent_config(NODE, workdir, library)
    inventory = open_inventory(f"simulated:{PROFILE}", seed=NODE)
    commands = SimulatedCommands(state_file=config.state_dir / "simulated-gpus.json")
    plugin = NodeAgent(
        config, api, inventory, commands, sharing=NodeSharing.parse(SHARING), publish_slices=True
    )

    out.section("Node agent: simulated GPUs published as a ResourceSlice")
    plugin.start()
    kubelet: KubeletStandIn | None = None
    prepared_pods: list[list[Obj]] = []
    try:
        slices = _wait_for_slices(api)
        out.line(f"node {NODE}: {PROFILE}, sharing {SHARING} (the node agent's --sharing)")
        rows = []
        for s in slices:
            for d in objects.slice_devices(s):
                attrs = d["attributes"]
                rows.append(
                    (
                        d["name"],
                        attrs["uuid"]["string"],
                        attrs["sharing"]["string"],
                        d["capacity"]["memory"]["value"],
                        d["capacity"]["cores"]["value"],
                        "yes" if d.get("allowMultipleAllocations") else "no",
                    )
                )
        out.line(
            render_table(("DEVICE", "UUID", "SHARING", "MEMORY", "CORES", "SHAREABLE"), rows, indent="  ")
        )
        out.line(f"published by the node agent as ResourceSlice {objects.name(slices[0])}")

        out.section("DeviceClasses from the install manifests (deploy/)")
        classes = _load_classes()
        for device_class in classes:
            api.create("DeviceClass", device_class)
        out.line(
            render_table(
                ("CLASS", "ALLOCATED BY", "GPU CONFIG"),
                [(objects.name(c), _allocated_by(c), _config_text(c)) for c in classes],
                indent="  ",
            )
        )

        out.section("Claims and pods")
        for plan in CLAIMS:
            api.create(
                "ResourceClaim",
                builders.claim(
                    plan.name,
                    plan.device_class,
                    namespace=NAMESPACE,
                    capacity=plan.capacity,
                    labels=plan.labels,
                ),
            )
        for pod_plan in PODS:
            api.create("Pod", builders.pod(pod_plan.name, pod_plan.claims, namespace=NAMESPACE))
        by_claim = {c.name: c for c in CLAIMS}
        out.line(
            render_table(
                ("POD", "CLAIM", "CLASS", "ASKS FOR", "WHAT IT SHOWS"),
                [
                    (
                        p.name,
                        ",".join(p.claims),
                        by_claim[p.claims[0]].device_class,
                        _asks(by_claim[p.claims[0]]),
                        p.what,
                    )
                    for p in PODS
                ],
                indent="  ",
            )
        )

        out.section("Scheduling: the allocator stands in for the kube-scheduler")
        scheduler = SchedulerStandIn(api)
        first = scheduler.schedule()
        report.first_round_pending = dict(first.pending)
        report.bound.update(first.bound)
        for pod, node in first.bound.items():
            out.line(f"  {pod:<11} bound to {node}")
        for pod, why in first.pending.items():
            out.line(f"  {pod:<11} pending: {why}")
        out.line(
            f"  (pods using {ANTI_AFFINITY_CLASS} wait: its marker selector matches no device, so only the "
            "controller can allocate their claims)"
        )

        out.section("Cluster controller: places the anti-affinity claims")
        reconciler = Reconciler(
            api,
            recorder=EventRecorder(api, "demo-controller", lambda: datetime.now(UTC)),
            metrics=ControllerMetrics(),
        )
        result = reconciler.reconcile(Snapshot.read(api))
        report.controller_allocated = dict(result.allocated)
        for claim, allocation in result.allocated.items():
            devices = [r.device for r in objects.device_results(allocation)]
            out.line(f"  {claim:<14} -> {', '.join(devices)} on {objects.allocation_node(allocation)}")
        for claim, why in result.failed.items():
            out.line(f"  {claim:<14} not allocated: {why}")
        second = scheduler.schedule()
        report.bound.update(second.bound)
        for pod, node in second.bound.items():
            out.line(f"  {pod:<11} bound to {node} by the scheduler stand-in (claim already allocated)")
        if second.pending:
            raise DemoError(f"pods still pending after the controller ran: {second.pending}")

        out.section("Kubelet: registration and NodePrepareResources over the real sockets")
        kubelet = KubeletStandIn(config.registration_socket)
        info = kubelet.register()
        endpoint = info["endpoint"].replace(str(workdir), "<demo dir>")
        out.line(f"  <demo dir> = {workdir}")
        out.line(f"  registered driver {info['name']} at {endpoint} ({', '.join(info['versions'])})")
        claims = {objects.name(c): c for c in api.list("ResourceClaim", NAMESPACE)[0]}
        registry_dirs = [config.cdi_dir]
        for pod_plan in PODS:
            used = [claims[name] for name in pod_plan.claims]
            answers = kubelet.prepare(used)
            prepared_pods.append(used)
            ids: list[str] = []
            for answer in answers.values():
                ids.extend(i for d in answer.devices for i in d.cdi_ids)
                if answer.error:
                    report.prepare_errors[f"{pod_plan.name}/{answer.claim}"] = answer.error
            out.line(f"  {pod_plan.name:<11} {_prepared_text(answers)}")
            if ids:
                config_for_container = Registry.load(registry_dirs).resolve(ids)
                report.containers.append(
                    ContainerView.of(
                        pod_plan.name, [objects.name(c) for c in used], ids, config_for_container
                    )
                )

        out.section("Who holds which share of each GPU")
        claims = {objects.name(c): c for c in api.list("ResourceClaim", NAMESPACE)[0]}
        report.gpus = _gpu_views(_wait_for_slices(api), claims, result.allocated)
        out.line(render_gpus(report.gpus))

        out.section("What each container receives (resolved from the CDI specs the node agent wrote)")
        out.line(render_containers(report.containers))

        out.section("GPU-wide settings the node agent made (simulated nvidia-smi / MPS control)")
        report.gpu_commands = [" ".join(call).replace(str(workdir), "<demo dir>") for call in commands.calls]
        for call in report.gpu_commands:
            out.line(f"  {call}")
        if not report.gpu_commands:
            out.line("  none")

        out.section("The limiter: a driver-API program under a 10 GiB cap (fake CUDA driver)")
        limited_view = next((c for c in report.containers if c.pod == "inference"), None)
        report.limiter = run_limiter_probe(limiter_build, limited_view, workdir)
        for line in report.limiter.lines:
            out.line(f"  {line}".replace(str(workdir), "<demo dir>"))

        out.section("Elastic compute: one limiter claim borrows the GPU time another leaves idle")
        report.elastic = run_elastic_step(out.line, api, workdir, limiter_build)

        out.section("MIG: a dynamic and a static H100 on a second node, instances made at prepare")
        report.mig = run_mig_step(out.line, api, workdir, library)
    finally:
        out.section("Clean up: NodeUnprepareResources, stop the node agent, remove temporary files")
        if kubelet is not None:
            for used in prepared_pods:
                errors = {k: v for k, v in kubelet.unprepare(used).items() if v}
                if errors:
                    out.line(f"  unprepare errors: {errors}")
            kubelet.close()
        plugin.stop(grace_s=0.5)
        inventory.close()
        leftover = sorted(p.name for p in config.cdi_dir.iterdir())
        out.line(f"  CDI specs left after unprepare: {len(leftover)}")


def _wait_for_slices(api: FakeKube, timeout_s: float = 20.0) -> list[Obj]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items = [s for s in api.list("ResourceSlice")[0] if objects.slice_node(s) == NODE]
        if items and any(objects.slice_devices(s) for s in items):
            return items
        time.sleep(0.02)
    raise DemoError("the node agent did not publish a ResourceSlice")


def _load_classes() -> list[Obj]:
    """The DeviceClasses as `deploy/` has them, plus an anti-affinity example class.

    The classes come from the manifest renderer (so an installed package works anywhere); the demo
    adds one controller-managed class with `antiAffinityLabel: app` through the same renderer unless
    the default values already carry one.
    """
    base = load_values()
    entries = [c.model_dump(mode="json", exclude_none=True) for c in base.controller.classes]
    if not any(e["name"] == ANTI_AFFINITY_CLASS for e in entries):
        entries.append(
            {
                "name": ANTI_AFFINITY_CLASS,
                "strategy": "Limiter",
                "placement": {"antiAffinityLabel": ANTI_AFFINITY_LABEL},
            }
        )
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump({"controller": {"enabled": True, "classes": entries}}, f)
        f.flush()
        rendered = render(load_values(Path(f.name)))
    classes = [d for d in yaml.safe_load_all(rendered["resourceclass.yaml"]) if d]
    managed = [with_marker(d) for d in yaml.safe_load_all(rendered["controller-classes.yaml"]) if d]
    return classes + managed


def _allocated_by(device_class: Obj) -> str:
    return "controller" if is_controller_managed(device_class) else "scheduler"


def _config_text(device_class: Obj) -> str:
    for entry in objects.class_configs(device_class):
        parameters = objects.opaque_parameters(entry)[1] or {}
        text = str(parameters.get("sharing", {}).get("strategy", ""))
        placement = parameters.get("placement")
        if placement:
            text += " + placement " + ", ".join(f"{k}={v}" for k, v in placement.items())
        return text
    return ""


def _asks(plan: ClaimPlan) -> str:
    if not plan.capacity:
        return "nothing (the whole GPU)"
    return ", ".join(f"{k} {v}" for k, v in plan.capacity.items())


def _prepared_text(answers: dict[str, Prepared]) -> str:
    parts = []
    for answer in answers.values():
        if answer.error:
            parts.append(f"{answer.claim}: ERROR {answer.error}")
            continue
        for device in answer.devices:
            share = f" share {device.share_id[:8]}" if device.share_id else ""
            parts.append(
                f"{answer.claim.split('/')[-1]}: {device.device}{share} -> {', '.join(device.cdi_ids)}"
            )
    return "; ".join(parts)


def _gpu_views(slices: list[Obj], claims: dict[str, Obj], by_controller: dict[str, Obj]) -> list[GpuView]:
    views: dict[str, GpuView] = {}
    for s in slices:
        for d in objects.slice_devices(s):
            views[d["name"]] = GpuView(
                device=d["name"],
                uuid=d["attributes"]["uuid"]["string"],
                sharing=d["attributes"]["sharing"]["string"],
                memory=d["capacity"]["memory"]["value"],
                cores=d["capacity"]["cores"]["value"],
            )
    for name, claim in sorted(claims.items()):
        allocation = objects.allocation(claim)
        if not allocation:
            continue
        pods = [r["name"] for r in objects.reserved_for(claim)]
        for result in objects.device_results(allocation):
            strategy = merge_configs(objects.allocation_config(allocation), result.request).sharing.strategy
            views[result.device].holders.append(
                GpuHolder(
                    claim=name,
                    strategy=strategy.value,
                    share=share_text(result.consumed),
                    consumed=dict(result.consumed or {}),
                    pods=sorted(pods),
                    allocated_by="controller" if f"{NAMESPACE}/{name}" in by_controller else "scheduler",
                )
            )
    return [views[k] for k in sorted(views)]
