"""The pod mount policy: a pod that uses resource claims mounts nothing where the limiter takes its word from.

The limiter reads each claim's limits, state and floor under the container's claims root and is loaded from
its library directory through `/etc/ld.so.preload`, all mounted by the claim's CDI spec. A pod spec chooses
its own volumes: a ConfigMap mounted read-only with `subPath` at `<claims root>/000-forged/limits` is, to the
library, a read-only mount of its own like the agent's. So a ValidatingAdmissionPolicy refuses pods with
resource claims whose containers (init and ephemeral ones included) mount a volume at or under those paths,
or at a path that is not in canonical form (`//`, `/./`, `/../`: the runtime cleans it into one of them).
The library's own checks (a limits file counts only with its own directory's state) are the layer under it.

What the runtime will do, not what the spec says:

- every volume type is judged alike (the check is on where a volume lands, not on what it is), and a raw
  block device's `volumeDevices[].devicePath` as a mount: the runtime makes a node there that would shadow
  a file the same way;
- paths are compared after the aliases a Debian or Ubuntu image has (`ALIASES`: `/var/run` is a link to
  `/run`, `/lib` to `/usr/lib`, ...): the runtime resolves them inside the image, and orders mounts by the
  path as written, so `/var/run/dra-gpu/claims/x/limits` would land over the agent's own mount;
- a pod that reaches a class through an extended resource (a class's `extendedResourceName`, or the
  implicit `deviceclass.resource.kubernetes.io/<class>`) has no `spec.resourceClaims` when it is created,
  and is judged as one that has them.

The expressions avoid CEL's optional syntax so that the tests can run them with the `cel` package.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Sequence
from typing import Any

from dra_gpu.limiter_abi.limits import CONTAINER_CLAIMS_ROOT, CONTAINER_LIBRARY, CONTAINER_PRELOAD
from dra_gpu.manifests.admission import policy_and_binding

Obj = dict[str, Any]

PROTECTED = (
    posixpath.dirname(CONTAINER_CLAIMS_ROOT),
    posixpath.dirname(CONTAINER_LIBRARY),
    CONTAINER_PRELOAD,
)
"""Where no pod of a claim may mount a volume of its own: the limiter's directory, its library's, the preload."""

MOUNT_MESSAGE = (
    f"a pod that uses resource claims mounts a volume or a block device at or under {', '.join(PROTECTED)} "
    f"(or an image's alias of one, such as /var/run for /run), where the dra-gpu "
    f"limiter reads a claim's limits and accounting (or is loaded from): only the node agent mounts there; "
    f"mount the volume at another path"
)
CANONICAL_MESSAGE = (
    "a pod that uses resource claims mounts a volume at a path with '//', '/./' or '/../' in it (or ending "
    "in '/.' or '/..'): write the mount path in canonical form"
)
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")

ALIASES = {
    "/var/run": "/run",
    "/var/lock": "/run/lock",
    "/lib": "/usr/lib",
    "/lib32": "/usr/lib32",
    "/lib64": "/usr/lib64",
    "/libx32": "/usr/libx32",
    "/bin": "/usr/bin",
    "/sbin": "/usr/sbin",
}
"""Top-level symbolic links of Debian and Ubuntu images (merged /usr; /var/run and /var/lock into /run):
alias -> what it resolves to."""
IMPLICIT_EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
"""Every DeviceClass is also requestable as this prefix + its name (DRAExtendedResource)."""


def spellings(path: str) -> list[str]:
    """`path` and every way of writing it through `ALIASES`."""
    found = [path]
    for alias, target in ALIASES.items():
        if path == target or path.startswith(target + "/"):
            found.append(alias + path[len(target) :])
    return found


def protected_spellings() -> list[str]:
    return [s for p in PROTECTED for s in spellings(p)]


def _every_mount(check: Callable[[str], str]) -> str:
    """CEL: `check` (of a path expression) holds for every volume mount and every block device of every
    container of the pod."""
    return (
        f"variables.containers.all(c, (!has(c.volumeMounts) || c.volumeMounts.all(m, {check('m.mountPath')})) && "
        f"(!has(c.volumeDevices) || c.volumeDevices.all(d, {check('d.devicePath')})))"
    )


def _containers() -> str:
    """CEL: every container of the pod, init and ephemeral ones included."""
    return " + ".join(f"(has(object.spec.{lst}) ? object.spec.{lst} : [])" for lst in CONTAINER_LISTS)


def _outside(path: str) -> str:
    """CEL: the path (made absolute, with a trailing slash) is not at or under any protected path, however
    spelled."""
    absolute = f"({path}.startsWith('/') ? {path} : '/' + {path})"
    return " && ".join(f"!({absolute} + '/').startsWith('{p}/')" for p in protected_spellings())


def _reaches_a_class(extended_names: Sequence[str]) -> str:
    """CEL (match condition): the pod has resource claims, or a container asks for one of the driver's
    classes through an extended resource (the claim is made for it after scheduling)."""
    containers = " + ".join(
        f"(has(object.spec.{lst}) ? object.spec.{lst} : [])" for lst in CONTAINER_LISTS[:2]
    )
    asks = f"k.startsWith({json.dumps(IMPLICIT_EXTENDED_RESOURCE_PREFIX)}) || k in {json.dumps(sorted(set(extended_names)))}"
    wanted = " || ".join(
        f"(has(c.resources) && has(c.resources.{kind}) && c.resources.{kind}.exists(k, {asks}))"
        for kind in ("limits", "requests")
    )
    return (
        f"(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) || "
        f"({containers}).exists(c, {wanted})"
    )


def _canonical(path: str) -> str:
    bad = ("//", "/./", "/../")
    tails = ("/.", "/..")
    return " && ".join(
        [*(f"!{path}.contains('{b}')" for b in bad), *(f"!{path}.endsWith('{t}')" for t in tails)]
    )


def pod_policy(name: str, labels: dict[str, str], extended_names: Sequence[str] = ()) -> list[Obj]:
    """The ValidatingAdmissionPolicy on pods (and their ephemeral containers), and its binding;
    `extended_names`: the extended resource names the driver's classes have."""
    spec: Obj = {
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
        "matchConditions": [{"name": "usesResourceClaims", "expression": _reaches_a_class(extended_names)}],
        "variables": [{"name": "containers", "expression": _containers()}],
        "validations": [
            {"expression": _every_mount(_canonical), "message": CANONICAL_MESSAGE},
            {"expression": _every_mount(_outside), "message": MOUNT_MESSAGE},
        ],
    }
    return policy_and_binding(name, labels, spec)
