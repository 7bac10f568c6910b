"""The node agent's enforcement, run in its own process for the enforcement checks (it needs the project).

`python3 -m gpucheck.enforce_agent SPEC.json` starts the agent's usage monitor exactly as the node agent
starts it (`dra_gpu.monitor.start_monitor`, the agent's default intervals, its NVML inventory and NVML
per-process figures, the host's /proc and cgroup mount), with one difference: only the check's own pods are
pods to it (`_only`), so that no tenant's process on the node is ever signalled or frozen by it. The claims
SPEC describes are each a Limiter claim on the checked GPU used by one pod, listed in the in-memory API server
as running; the check names the pod's container cgroup after the pod's UID and the container's ID. It prints
`pods=` (each pod's UID, which the API server gave it) and `ready`, enforces until its stdin reaches end of
file, stops (which thaws whatever it froze) and prints one line of JSON: the Events the watchdog wrote, the
compute hold's constants and each claim's freezes.

SPEC: {"node", "state_dir", "gpu", "limiter" (the library file, or null), "inventory" ("nvml": the agent's
NVML inventory; "checked": the checked GPU alone, by its UUID, with NVML's per-process figures all the same,
for an NVML that answers the per-process queries but not all of the inventory's, as the limiter's fake NVML
does), "claims": [{"uid", "name", "memory" (bytes or null), "cores" (percent or null), "pod",
"container_id"}]}.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMESPACE = "gpu-check"


@dataclass(frozen=True)
class _Gpu:
    uuid: str


class CheckedGpu:
    """An inventory of the checked GPU alone (`"inventory": "checked"`): NVML's, so the monitor samples it."""

    backend = "nvml"

    def __init__(self, uuid: str) -> None:
        self._gpus = [_Gpu(uuid)]

    def gpus(self) -> list[_Gpu]:
        return self._gpus

    def close(self) -> None:
        pass


def add_pod(api: Any, node: str, name: str, container_id: str, claim: str) -> str:
    """A running pod of one container using `claim`; its UID (the API server's, which the kubelet names the
    pod's cgroup after)."""
    from dra_gpu.kube import builders, objects

    pod = api.create(
        "Pod", builders.pod(name, [claim], namespace=NAMESPACE, node_name=node, image="gpu-check")
    )
    api.update_status("Pod", builders.with_container_ids(pod, {"main": f"containerd://{container_id}"}))
    return objects.uid(pod)


def _only(pods: set[str]) -> Any:
    """The agent's reader of host processes, to which only the check's pods are pods: a process of another pod
    on this node (a tenant's, on a node that serves work) is one outside pods, which the watchdog only reports
    and the hold never freezes, where the agent would stop it as a process on a GPU that no claim owns."""
    from dra_gpu.monitor.process_owner import PodRef, ProcReader

    class OnlyThesePods(ProcReader):
        def pod_of(self, pid: int) -> PodRef | None:
            ref = super().pod_of(pid)
            return ref if ref is not None and ref.pod_uid in pods else None

    return OnlyThesePods


def serve(
    spec: dict[str, Any], wait: Callable[[dict[str, str]], None], inventory: Any = None, nvml: Any = None
) -> dict[str, Any]:
    """Enforces the claims of `spec` until `wait(pods)` returns (`pods`: each pod's UID by its name); what it
    did. `inventory` and `nvml`: the node's (the NVML inventory, pynvml) unless a test hands in others."""
    from prometheus_client import CollectorRegistry

    from dra_gpu.config import Strategy
    from dra_gpu.inventory import open_inventory
    from dra_gpu.kube.fake import FakeKube
    from dra_gpu.monitor import ClaimHoldings, MonitorConfig, setup, start_monitor
    from dra_gpu.monitor.monitor import Held
    from dra_gpu.monitor.watchdog import ClaimRef
    from dra_gpu.node_agent import NodeAgentConfig

    defaults: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(NodeAgentConfig)}
    node = str(spec["node"])
    api = FakeKube()
    holdings = []
    pods = {}
    for c in spec["claims"]:
        ref = ClaimRef(str(c["uid"]), NAMESPACE, str(c["name"]))
        held = Held(ref, str(spec["gpu"]), Strategy.LIMITER.value, c.get("memory"), c.get("cores"), None)
        holdings.append(ClaimHoldings(ref, (held,)))
        pods[str(c["pod"])] = add_pod(api, node, str(c["pod"]), str(c["container_id"]), str(c["name"]))
    claims_dir = Path(spec["state_dir"]) / "claims"
    config = MonitorConfig(
        node_name=node,
        claims_dir=claims_dir,
        interval_s=float(defaults["monitor_interval_s"]),
        watch_interval_s=min(
            float(defaults["monitor_watch_interval_s"]), float(defaults["monitor_interval_s"])
        ),
        cgroup_root=Path(spec.get("cgroup_root") or defaults["cgroup_root"]),
        limiter_library=Path(spec["limiter"]) if spec.get("limiter") else None,
    )
    kind = str(spec.get("inventory") or "nvml")
    if inventory is not None:
        opened = inventory
    elif kind == "checked":
        opened = CheckedGpu(str(spec["gpu"]))
    else:
        opened = open_inventory(kind, seed=node)
    name = "ProcReader"  # what start_monitor reads host processes with
    reader = getattr(setup, name)
    setattr(setup, name, _only(set(pods.values())))
    try:
        monitor = start_monitor(config, api, opened, CollectorRegistry(), lambda: holdings, nvml=nvml)
    finally:
        setattr(setup, name, reader)
    accounts: dict[str, dict[str, Any]] = {}
    try:
        wait(pods)
        for (uid, _gpu), account in monitor.hold.accounts.items():
            accounts[uid] = {"freezes": account.freezes, "frozen_s": round(account.frozen_seconds, 3)}
    finally:
        monitor.stop()
        if inventory is None:
            opened.close()
    events = [
        {
            "reason": e.get("reason"),
            "kind": (e.get("involvedObject") or {}).get("kind"),
            "name": (e.get("involvedObject") or {}).get("name"),
            "message": e.get("message"),
        }
        for e in api.objects("Event")
    ]
    return {
        "events": events,
        "accounts": accounts,
        "hold": {
            "margin": monitor.hold.margin,
            "burst_s": monitor.hold.burst_s,
            "max_freeze_s": monitor.hold.max_freeze_s,
        },
        "interval_s": config.interval_s,
        "watch_interval_s": config.watch_interval_s,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m gpucheck.enforce_agent SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())

    def wait(pods: dict[str, str]) -> None:
        print(f"pods={json.dumps(pods)}", flush=True)
        print("ready", flush=True)
        sys.stdin.read()

    try:
        out = serve(spec, wait)
    except Exception as exc:  # one line the check can quote, never a traceback only
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
