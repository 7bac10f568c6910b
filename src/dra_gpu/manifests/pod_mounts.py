"""The pod mount policy: a pod that uses resource claims mounts nothing where the limiter takes its word from.

The limiter reads each claim's limits, state and floor under the container's claims root and is loaded from
its library directory through `/etc/ld.so.preload`, all mounted by the claim's CDI spec. A pod spec chooses
its own volumes: a ConfigMap mounted read-only with `subPath` at `<claims root>/000-forged/limits` is, to the
library, a read-only mount of its own like the agent's. So a ValidatingAdmissionPolicy refuses pods with
resource claims whose containers (init and ephemeral ones included) mount a volume at or under those paths,
or at a path that is not in canonical form (`//`, `/./`, `/../`: the runtime cleans it into one of them).
The library's own checks (a limits file counts only with its own directory's state) are the layer under it.

The expressions avoid CEL's optional syntax so that the tests can run them with the `cel` package.
"""

from __future__ import annotations

import posixpath
from typing import Any

from dra_gpu.limiter_abi.limits import CONTAINER_CLAIMS_ROOT, CONTAINER_LIBRARY, CONTAINER_PRELOAD

Obj = dict[str, Any]

PROTECTED = (
    posixpath.dirname(CONTAINER_CLAIMS_ROOT),
    posixpath.dirname(CONTAINER_LIBRARY),
    CONTAINER_PRELOAD,
)
"""Where no pod of a claim may mount a volume of its own: the limiter's directory, its library's, the preload."""

MOUNT_MESSAGE = (
    f"a pod that uses resource claims mounts a volume at or under {', '.join(PROTECTED)}, where the dra-gpu "
    f"limiter reads a claim's limits and accounting (or is loaded from): only the node agent mounts there; "
    f"mount the volume at another path"
)
CANONICAL_MESSAGE = (
    "a pod that uses resource claims mounts a volume at a path with '//', '/./' or '/../' in it (or ending "
    "in '/.' or '/..'): write the mount path in canonical form"
)
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _every_mount(check: str) -> str:
    """CEL: `check` (over `m`, a volumeMount) holds for every mount of every container of the pod."""
    return f"variables.containers.all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, {check}))"


def _containers() -> str:
    """CEL: every container of the pod, init and ephemeral ones included."""
    return " + ".join(f"(has(object.spec.{lst}) ? object.spec.{lst} : [])" for lst in CONTAINER_LISTS)


def _outside(path: str) -> str:
    """CEL: the mount path (made absolute, with a trailing slash) is not at or under any protected path."""
    absolute = f"({path}.startsWith('/') ? {path} : '/' + {path})"
    return " && ".join(f"!({absolute} + '/').startsWith('{p}/')" for p in PROTECTED)


def _canonical(path: str) -> str:
    bad = ("//", "/./", "/../")
    tails = ("/.", "/..")
    return " && ".join(
        [*(f"!{path}.contains('{b}')" for b in bad), *(f"!{path}.endsWith('{t}')" for t in tails)]
    )


def pod_policy(name: str, labels: dict[str, str]) -> list[Obj]:
    """The ValidatingAdmissionPolicy on pods (and their ephemeral containers), and its binding."""
    policy: Obj = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["pods", "pods/ephemeralcontainers"],
                    }
                ],
            },
            "matchConditions": [
                {
                    "name": "usesResourceClaims",
                    "expression": "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0",
                }
            ],
            "variables": [{"name": "containers", "expression": _containers()}],
            "validations": [
                {"expression": _every_mount(_canonical("m.mountPath")), "message": CANONICAL_MESSAGE},
                {"expression": _every_mount(_outside("m.mountPath")), "message": MOUNT_MESSAGE},
            ],
        },
    }
    binding: Obj = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]
