"""The least-privilege figures of an install, read from its rendered manifests (a `deploy/` directory).

Prints, for the manifests in DIR (default `deploy/`; give an older checkout's to compare):

- the host paths mounted into the node agent, how many of them read-write, and whether `/` is one;
- whether a pod without a token can read `/metrics` (no token check configured, no NetworkPolicy);
- how many crafted pod specs that mount over a claim's files the pod-mounts policy lets through (each
  volume type, a block device, a Debian alias, a pod that reaches a class through an extended resource),
  its CEL evaluated with the project's CEL;
- whether the ResourceSlice policy lets a node publish another node's pool.

    .venv/bin/python bench/security.py [--deploy DIR]
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import cel
import yaml

from dra_gpu import DRIVER_NAME
from dra_gpu.allocator.cel_env import kubernetes_context, rewrite_optionals
from dra_gpu.kube import builders, objects

Obj = dict[str, Any]
FORGED = "/run/dra-gpu/claims/000-forged/limits"
VOLUMES: list[Obj] = [
    {"configMap": {"name": "forged"}},
    {"secret": {"secretName": "forged"}},
    {"emptyDir": {}},
    {"hostPath": {"path": "/tmp/forged"}},
    {"projected": {"sources": [{"configMap": {"name": "forged"}}]}},
    {"downwardAPI": {"items": [{"path": "limits", "fieldRef": {"fieldPath": "metadata.name"}}]}},
    {"persistentVolumeClaim": {"claimName": "forged"}},
    {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
    {"image": {"reference": "registry.example/forged:1"}},
    {"csi": {"driver": "secrets-store.csi.k8s.io"}},
]


def load(deploy: Path) -> list[Obj]:
    return [d for f in sorted(deploy.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def run(expression: str, context: Any) -> Any:
    return cel.compile(rewrite_optionals(expression)).execute(context)


def admitted(policy: Obj, variables_in: Obj) -> bool:
    """Whether the policy lets the request through (a match condition that does not hold: not judged)."""
    spec = objects.spec(policy)
    context = kubernetes_context()
    for name, value in variables_in.items():
        context.add_variable(name, value)
    if not all(run(c["expression"], context) is True for c in spec.get("matchConditions", [])):
        return True
    variables: Obj = {}
    for variable in spec.get("variables", []):
        context.add_variable("variables", variables)
        variables[variable["name"]] = run(variable["expression"], context)
    context.add_variable("variables", variables)
    return all(run(v["expression"], context) is True for v in spec["validations"])


def crafted_pods() -> list[tuple[str, Obj]]:
    """Pods that put a volume or a device over a claim's limits file, each a way the review found."""

    def pod(claims: bool = True) -> tuple[Obj, Obj]:
        made = builders.pod("p", ["shared"] if claims else [], namespace="t")
        return made, objects.spec(made)["containers"][0]

    pods = []
    for source in VOLUMES:
        p, container = pod()
        objects.spec(p)["volumes"] = [{"name": "v", **source}]
        container["volumeMounts"] = [{"name": "v", "mountPath": FORGED, "subPath": "limits"}]
        pods.append((f"volume {next(iter(source))}", p))
    p, container = pod()
    container["volumeMounts"] = [{"name": "v", "mountPath": "/var/run" + FORGED.removeprefix("/run")}]
    pods.append(("alias /var/run", p))
    p, container = pod()
    container["volumeDevices"] = [{"name": "v", "devicePath": FORGED}]
    pods.append(("volumeDevices", p))
    p, container = pod(claims=False)
    container["volumeMounts"] = [{"name": "v", "mountPath": FORGED}]
    container["resources"] = {"limits": {f"deviceclass.resource.kubernetes.io/limiter.{DRIVER_NAME}": "1"}}
    pods.append(("extended resource", p))
    return pods


def shadow_admitted(policy: Obj) -> bool:
    """Node A's agent creating a slice of pool "node-b" (on node A) at a high generation."""
    shadow = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "shadow"},
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": "node-a",
            "pool": {"name": "node-b", "generation": 99, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }
    condition = objects.spec(policy)["matchConditions"][0]["expression"]
    username = condition.split('"')[1]
    request = {
        "operation": "CREATE",
        "userInfo": {"username": username, "extra": {"authentication.kubernetes.io/node-name": ["node-a"]}},
    }
    return admitted(policy, {"request": request, "object": copy.deepcopy(shadow), "oldObject": None})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deploy", type=Path, default=Path("deploy"))
    docs = load(parser.parse_args().deploy)
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = objects.spec(objects.spec(daemonset)["template"])
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    mounts = {
        (volumes[m["name"]], not m.get("readOnly"))
        for c in [*pod.get("initContainers", []), *pod["containers"]]
        for m in c.get("volumeMounts", [])
        if volumes.get(m["name"])
    }
    paths = {p for p, _ in mounts}
    writable = {p for p, rw in mounts if rw}
    print(
        f"host paths mounted into the agent: {len(paths)}, read-write: {len(writable)}, '/': {'/' in paths}"
    )
    envs = {e["name"]: e.get("value") for c in pod["containers"] for e in c.get("env", [])}
    token = envs.get("DRA_GPU_METRICS_AUTH") == "true"
    policy = any(d["kind"] == "NetworkPolicy" for d in docs)
    print(f"/metrics without a token: {'refused (401)' if token else 'answered'}; NetworkPolicy: {policy}")
    policies = {objects.name(d): d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    mounts_policy = policies.get("dra-gpu-pod-mounts")
    through = [
        n for n, p in crafted_pods() if mounts_policy is None or admitted(mounts_policy, {"object": p})
    ]
    print(f"crafted pod specs over a claim's files admitted: {len(through)} of {len(crafted_pods())}", end="")
    print(f" ({', '.join(through)})" if through else "")
    slices = policies.get("dra-gpu-resourceslices")
    shadow = slices is None or shadow_admitted(slices)
    print(f"a node publishing another node's pool at admission: {'admitted' if shadow else 'refused'}")


if __name__ == "__main__":
    main()
