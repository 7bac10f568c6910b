"""The demo's elastic compute step: two limiter claims on one simulated GPU, one borrowing the other's idle time.

A third node's agent (the real one, with its monitor and /metrics) prepares two limiter claims on its one GPU:
`steady` (floor 30 %, ceiling 100 %) works all along; `bursty` (a fixed 70 %) sleeps, wakes, and sleeps
again. Each claim's process (`claim_process`) is real: in a mount namespace of its own it sees its claim's
files where its CDI spec mounts them, and the native limiter, preloaded, arbitrates launch by launch from
the agent's board and the claims' activity files, against the fake CUDA driver. The chart is drawn from the
activity files while they run; then `dra-gpu usage` reads the agent's /metrics for used, borrowed and lent.

The fake driver gives each process a simulated GPU of its own: a claim's share in the chart is what the
limiter's admission let it run, not the contention of one real GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import dra_gpu
from cdi.resolver import Registry
from dra_gpu import DRIVER_NAME
from dra_gpu.config import NodeSharing
from dra_gpu.demo import claim_process
from dra_gpu.demo.kubelet import KubeletStandIn
from dra_gpu.demo.limiter_step import FAKE_DRIVER_DIR, LIBRARY
from dra_gpu.demo.node_dirs import node_agent_config
from dra_gpu.demo.report import ContainerView
from dra_gpu.demo.scheduler import SchedulerStandIn
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import open_inventory
from dra_gpu.kube import builders, objects
from dra_gpu.kube.errors import AlreadyExists
from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi.board import GPUS_DIR, activity_name, read_activity
from dra_gpu.manifests.classes import priority_classes
from dra_gpu.node_agent import NodeAgent
from dra_gpu.plugin.sharing.steps.device_access import device_uuids
from dra_gpu.usage import collect, render_table
from dra_gpu.usage.live import fetch_url, parse_metrics, read_agents

Obj = dict[str, Any]

ELASTIC_NODE = "demo-elastic-node"
ELASTIC_PROFILE = "1xH100-80GB"
ELASTIC_SHARING = "0=Shared"
NAMESPACE = "demo"
SAMPLE_S = 0.25
"""The chart's time step."""
RUN_S = 4.5
KERNEL_US = 1000
BAR = 25
"""Characters for 100 % of the GPU."""
GRANTING_CLASS = f"standard.limiter.{DRIVER_NAME}"
"""The class of a claim with a ceiling: the admin's limiter class that grants one up to the whole GPU
(`priority_classes`); a fixed share uses the install's limiter class, which grants none (docs/elastic-compute.md)."""
LEFT_OUT = ("NVIDIA_VISIBLE_DEVICES",)
"""Read by the NVIDIA container runtime, not by CUDA: the fake exposes the GPUs CUDA_VISIBLE_DEVICES names."""


@dataclass(frozen=True)
class ElasticPlan:
    claim: str
    pod: str
    floor: int
    ceiling: int
    phases: tuple[tuple[float, float], ...]
    """When the claim's process launches kernels (seconds from the start); idle in between."""


PLANS = (
    ElasticPlan("steady", "trainer-elastic", 30, 100, ((0.0, RUN_S),)),
    ElasticPlan("bursty", "inference-elastic", 70, 70, ((1.5, 3.0),)),
)


@dataclass
class ElasticSample:
    at_s: float
    used: dict[str, float]
    """Claim -> percent of the GPU it used in the step before `at_s` (its activity file's used_ns)."""
    borrowed: dict[str, float]
    """Claim -> the part of that above its floor (its activity file's borrowed_ns)."""


@dataclass
class ElasticReport:
    ran: bool = False
    skipped: str = ""
    samples: list[ElasticSample] = field(default_factory=list)
    totals: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """Claim -> (used, borrowed, lent) seconds, as the agent's /metrics give them to `dra-gpu usage`."""
    usage: str = ""
    """What `dra-gpu usage --node demo-elastic-node` printed."""
    errors: dict[str, str] = field(default_factory=dict)


def why_not_run(build: Path | None) -> str:
    """Why the step cannot run here ("" when it can)."""
    if build is None or not (build / LIBRARY).is_file() or not (build / FAKE_DRIVER_DIR).is_dir():
        return (
            "the native limiter is not built here (`make -C native/limiter` builds it; `make demo` tries to)"
        )
    try:
        done = subprocess.run(
            ["unshare", "--map-root-user", "--mount", "true"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot start a process in a mount namespace of its own (unshare: {exc})"
    if done.returncode != 0:
        return f"user namespaces are not allowed here (unshare: {done.stderr.strip() or done.returncode})"
    return ""


def run_elastic_step(
    line: Callable[[str], None], api: FakeKube, workdir: Path, build: Path | None
) -> ElasticReport:
    report = ElasticReport(skipped=why_not_run(build))
    if report.skipped or build is None:
        line(f"skipped: {report.skipped}")
        return report
    config = replace(
        node_agent_config(ELASTIC_NODE, workdir / "elastic", build / LIBRARY),
        http_address="127.0.0.1:0",
        monitor_interval_s=SAMPLE_S,
    )
    api.create("Node", builders.node(ELASTIC_NODE))
    for device_class in priority_classes():
        if objects.name(device_class) == GRANTING_CLASS:
            with contextlib.suppress(AlreadyExists):
                api.create("DeviceClass", device_class)
    inventory = open_inventory(f"simulated:{ELASTIC_PROFILE}", seed=ELASTIC_NODE)
    agent = NodeAgent(
        config,
        api,
        inventory,
        SimulatedCommands(state_file=config.state_dir / "simulated-gpus.json"),
        sharing=NodeSharing.parse(ELASTIC_SHARING),
        publish_slices=True,
    )
    agent.start()
    kubelet: KubeletStandIn | None = None
    prepared: list[Obj] = []
    try:
        if not _poll(
            lambda: any(objects.slice_node(s) == ELASTIC_NODE for s in api.list("ResourceSlice")[0])
        ):
            raise RuntimeError("the elastic node's agent did not publish its ResourceSlice")
        gpu = inventory.gpus()[0].uuid
        for plan in PLANS:
            api.create("ResourceClaim", _claim(plan, gpu))
            api.create("Pod", builders.pod(plan.pod, [plan.claim], namespace=NAMESPACE))
        scheduled = SchedulerStandIn(api).schedule()
        report.errors.update({f"schedule/{p}": why for p, why in scheduled.pending.items()})
        kubelet = KubeletStandIn(config.registration_socket)
        kubelet.register()
        claims = {objects.name(c): c for c in api.list("ResourceClaim", NAMESPACE)[0]}
        views: dict[str, ContainerView] = {}
        for plan in PLANS:
            claim = claims[plan.claim]
            answers = kubelet.prepare([claim])
            prepared.append(claim)
            ids = [i for a in answers.values() for d in a.devices for i in d.cdi_ids]
            for answer in answers.values():
                if answer.error:
                    report.errors[plan.claim] = answer.error
            if ids:
                resolved = Registry.load([config.cdi_dir]).resolve(ids)
                views[plan.claim] = ContainerView.of(plan.pod, [plan.claim], ids, resolved)
        if report.errors or len(views) != len(PLANS):
            line(f"the claims were not prepared: {report.errors}")
            return report
        line(f"node {ELASTIC_NODE}: {ELASTIC_PROFILE} ({gpu}), sharing {ELASTIC_SHARING}")
        for plan in PLANS:
            line(f"  {plan.claim:<7} (pod {plan.pod}): {_plan_text(plan)}")
        line(
            "each claim's process runs under the limiter in a mount namespace holding its CDI mounts; the fake "
            "CUDA driver\ngives each process a simulated GPU of its own, so a share below is what the "
            "limiter let that claim run:"
        )
        activity = {
            plan.claim: config.state_dir / GPUS_DIR / gpu / activity_name(objects.uid(claims[plan.claim]))
            for plan in PLANS
        }
        report.samples = _run_and_sample(views, build, activity, report.errors)
        report.ran = not report.errors
        line(render_chart(report.samples))
        if report.ran:
            _read_usage(report, agent, api)
            line("$ dra-gpu usage --node demo-elastic-node --metrics-url <the agent's /metrics>")
            line("\n".join(f"  {text}" for text in report.usage.splitlines()))
        else:
            line(f"a claim's process failed: {report.errors}")
    finally:
        if kubelet is not None:
            for uid, error in kubelet.unprepare(prepared).items():
                if error:
                    report.errors[f"unprepare/{uid}"] = error
            kubelet.close()
        agent.stop(grace_s=0.5)
        inventory.close()
    return report


def _claim(plan: ElasticPlan, gpu: str) -> Obj:
    """The plan's limiter claim, on `gpu` (by UUID: the other nodes' shared GPUs would take it too)."""
    request = builders.exact_request(
        "gpu",
        GRANTING_CLASS if plan.ceiling != plan.floor else f"limiter.{DRIVER_NAME}",
        capacity={"memory": "4Gi", "cores": str(plan.floor)},
        selectors=[f'device.attributes["{DRIVER_NAME}"].uuid == "{gpu}"'],
    )
    configs = []
    if plan.ceiling != plan.floor:
        parameters = {
            "apiVersion": dra_gpu.CONFIG_API_VERSION,
            "kind": dra_gpu.CONFIG_KIND,
            "sharing": {"strategy": "Limiter", "limiter": {"compute": {"limit": plan.ceiling}}},
        }
        configs.append(builders.opaque_config(DRIVER_NAME, parameters))
    return builders.resource_claim(plan.claim, [request], namespace=NAMESPACE, configs=configs)


def _share_text(plan: ElasticPlan) -> str:
    ceiling = f"ceiling {plan.ceiling} %" if plan.ceiling != plan.floor else "fixed"
    return f"floor {plan.floor} %, {ceiling}"


def _plan_text(plan: ElasticPlan) -> str:
    busy = ", ".join(f"{a:.1f}-{b:.1f} s" for a, b in plan.phases)
    return f"{_share_text(plan)}; launches kernels {busy}, idle otherwise"


def _worker_env(view: ContainerView, build: Path) -> dict[str, str]:
    env = {k: v for k, v in view.env.items() if k not in LEFT_OUT}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(device_uuids(view.env))
    env["LD_LIBRARY_PATH"] = str(build / FAKE_DRIVER_DIR)
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    env["PYTHONPATH"] = str(Path(dra_gpu.__file__).resolve().parents[1])
    env["FAKE_CUDA_SM_COUNT"] = str(claim_process.SM_COUNT)
    env["FAKE_CUDA_WAVE_NS"] = str(claim_process.WAVE_US * 1000)
    return env


def _run_and_sample(
    views: dict[str, ContainerView], build: Path, activity: dict[str, Path], errors: dict[str, str]
) -> list[ElasticSample]:
    processes: dict[str, subprocess.Popen[str]] = {}
    for plan in PLANS:
        spec = {
            "library": str(build / LIBRARY),
            "env": _worker_env(views[plan.claim], build),
            "mounts": [list(m) for m in views[plan.claim].mounts],
            "phases": [list(p) for p in plan.phases],
            "kernel_us": KERNEL_US,
        }
        processes[plan.claim] = subprocess.Popen(
            [
                "unshare",
                "--map-root-user",
                "--mount",
                "--propagation",
                "private",
                sys.executable,
                "-m",
                claim_process.__name__,
                json.dumps(spec),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    samples: list[ElasticSample] = []
    try:
        for process in processes.values():  # each set up (mounts, limiter, driver), or gone
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                return samples
        begin = at = time.monotonic()
        for process in processes.values():
            assert process.stdin is not None
            process.stdin.write(f"{begin}\n")
            process.stdin.flush()
        previous = {c: _counters(p) for c, p in activity.items()}
        for step in range(1, round(RUN_S / SAMPLE_S) + 1):
            # Pacing the chart, not waiting for a process: each row is the step that just ended.
            time.sleep(max(0.0, begin + step * SAMPLE_S - time.monotonic()))
            now = time.monotonic()
            current = {c: _counters(p) for c, p in activity.items()}
            span = (now - at) * 1e9
            samples.append(
                ElasticSample(
                    at_s=now - begin,
                    used={c: 100 * (current[c][0] - previous[c][0]) / span for c in current},
                    borrowed={c: 100 * (current[c][1] - previous[c][1]) / span for c in current},
                )
            )
            previous, at = current, now
    finally:
        for claim, process in processes.items():
            try:
                _, err = process.communicate(timeout=RUN_S + 30)  # closes its stdin: a waiting one ends
            except subprocess.TimeoutExpired:
                process.kill()
                _, err = process.communicate()
            if process.returncode != 0:
                said = (err or "").strip().splitlines()
                errors[claim] = said[-1] if said else f"exit status {process.returncode}"
    return samples


def _counters(path: Path) -> tuple[int, int]:
    """(used_ns, borrowed_ns) the claim's processes reported so far."""
    report = read_activity(path)
    return (0, 0) if report is None else (report.used_ns, report.borrowed_ns)


def _read_usage(report: ElasticReport, agent: NodeAgent, api: FakeKube) -> None:
    """`dra-gpu usage` against this node's agent, once its monitor has sampled the end of the run."""
    url = f"http://127.0.0.1:{agent.http_port}/metrics"

    def totals() -> dict[str, tuple[float, float, float]]:
        live = parse_metrics(fetch_url(url))
        out = {}
        for (_, claim, _), use in live.claims.items():
            if use.compute_used_seconds is not None:
                out[claim] = (
                    use.compute_used_seconds,
                    use.compute_borrowed_seconds or 0.0,
                    use.compute_lent_seconds or 0.0,
                )
        return out

    _poll(lambda: any(t[2] > 0 for t in totals().values()), timeout_s=5 * SAMPLE_S + 5)
    report.totals = totals()
    # What `dra-gpu usage --node ... --metrics-url ...` does, with the demo's in-process API server.
    usage = collect(
        api.list("ResourceSlice")[0],
        api.list("ResourceClaim")[0],
        api.list("DeviceClass")[0],
        node=ELASTIC_NODE,
    )
    report.usage = render_table(usage, read_agents([url], fetch_url)).rstrip()


def render_chart(samples: list[ElasticSample]) -> str:
    """One row per time step, a bar per claim: `#` what it ran within its floor, `+` what it borrowed."""
    heads = [f"{p.claim}: {_share_text(p)}" for p in PLANS]
    lines = ["  TIME   " + "".join(f" {h:<{BAR + 10}}" for h in heads).rstrip()]
    for sample in samples:
        bars = []
        for plan in PLANS:
            used = max(0.0, min(100.0, sample.used.get(plan.claim, 0.0)))
            borrowed = max(0.0, min(used, sample.borrowed.get(plan.claim, 0.0)))
            own, lent = round((used - borrowed) * BAR / 100), round(borrowed * BAR / 100)
            bars.append(f"|{('#' * own + '+' * lent).ljust(BAR)[:BAR]}|{used:4.0f} %")
        lines.append(f"  {sample.at_s:4.2f} s " + "".join(f" {b:<{BAR + 10}}" for b in bars).rstrip())
    lines.append("         # within its floor   + borrowed: time another claim left idle")
    return "\n".join(lines)


def _poll(ready: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """Whether `ready()` came true before the deadline."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
