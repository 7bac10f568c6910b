"""The semantic checks a runtime's CDI library runs when it loads a spec.

Mirrors ``pkg/cdi/spec.go`` (``validate``), ``container-edits.go`` (``Validate``) and the default
device validator: version known and high enough, valid kind and device names, unique device
names, non-empty device edits, ``NAME=VALUE`` env entries, known hook names, device node types and
permissions, mounts with both paths, net devices unique. Annotation key syntax is not checked.
"""

from __future__ import annotations

from cdi import names, version
from cdi.errors import CDIError
from cdi.spec import ContainerEdits, Spec

HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
DEVICE_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})


def version_problems(spec: Spec, max_version: str | None = None) -> list[str]:
    """Problems with ``cdiVersion``; ``max_version`` models a runtime that knows nothing newer."""
    if not spec.cdi_version:
        return ["cdiVersion is missing; set it to the lowest version covering the features used"]
    given = spec.cdi_version
    if not version.is_known(given):
        return [
            f"cdiVersion {given!r} is not a known CDI version (known: {', '.join(version.KNOWN_VERSIONS)})"
        ]
    problems: list[str] = []
    needed = version.minimum_version(spec)
    if max_version is not None and version.version_key(given) > version.version_key(max_version):
        problems.append(
            f"cdiVersion {version.normalize(given)} is newer than the runtime's CDI library supports "
            f"(at most {max_version}); the features used need only {needed}"
        )
    if max_version is not None and version.version_key(needed) > version.version_key(max_version):
        problems.append(
            f"the features used need cdiVersion {needed}, newer than the runtime supports (at most "
            f"{max_version}): {', '.join(version.features_needing(spec, max_version))}"
        )
    if version.version_key(needed) > version.version_key(given):
        problems.append(
            f"cdiVersion {version.normalize(given)} is too low for the features used, which need {needed}: "
            f"{', '.join(version.features_needing(spec, given))}"
        )
    return problems


def name_problems(spec: Spec) -> list[str]:
    problems: list[str] = []
    try:
        names.parse_kind(spec.kind)
    except CDIError as e:
        problems.append(str(e))
    seen: set[str] = set()
    for dev in spec.devices:
        try:
            names.validate_device_name(dev.name)
        except CDIError as e:
            problems.append(str(e))
        if dev.name in seen:
            problems.append(f"device {dev.name!r} is defined more than once in the spec")
        seen.add(dev.name)
    return problems


def edit_problems(edits: ContainerEdits, where: str) -> list[str]:
    problems = [f"{where}: env entry {e!r} is not NAME=VALUE" for e in edits.env or () if e.find("=") <= 0]
    for node in edits.device_nodes or ():
        if not node.path:
            problems.append(f"{where}: a device node has an empty path")
        if (node.type or "") not in DEVICE_NODE_TYPES:
            problems.append(
                f"{where}: device node {node.path!r} has invalid type {node.type!r} (b, c, u or p)"
            )
        if (node.major or 0) < 0 or (node.minor or 0) < 0:
            problems.append(f"{where}: device node {node.path!r} has a negative device number")
        perms = node.permissions or ""
        if perms != "none" and perms.strip("rwm"):
            problems.append(
                f"{where}: device node {node.path!r} has invalid permissions {perms!r} "
                "(a combination of r, w, m, or 'none')"
            )
    for hook in edits.hooks or ():
        if hook.hook_name not in HOOK_NAMES:
            problems.append(
                f"{where}: hook name {hook.hook_name!r} is invalid (one of {', '.join(sorted(HOOK_NAMES))})"
            )
        if not hook.path:
            problems.append(f"{where}: hook {hook.hook_name!r} has an empty path")
        problems += [
            f"{where}: hook {hook.hook_name!r} env entry {e!r} is not NAME=VALUE"
            for e in hook.env or ()
            if e.find("=") <= 0
        ]
    for mount in edits.mounts or ():
        if not mount.host_path or not mount.container_path:
            problems.append(f"{where}: a mount needs both hostPath and containerPath")
    rdt = edits.intel_rdt
    if rdt is not None and rdt.clos_id not in (None, "/"):
        c = rdt.clos_id or ""
        if len(c) >= 4096 or c in (".", "..") or "/" in c or "\n" in c:
            problems.append(f"{where}: intelRdt.closID {c!r} is not a valid file name")
    hosts: set[str] = set()
    ifnames: set[str] = set()
    for net in edits.net_devices or ():
        if not net.host_interface_name or not net.name:
            problems.append(f"{where}: a net device needs both hostInterfaceName and name")
        if net.host_interface_name in hosts or net.name in ifnames:
            problems.append(f"{where}: net device {net.host_interface_name!r} -> {net.name!r} is a duplicate")
        hosts.add(net.host_interface_name)
        ifnames.add(net.name)
    return problems


def spec_problems(spec: Spec, max_version: str | None = None) -> list[str]:
    """Everything that would make a runtime's CDI library refuse this spec."""
    problems = version_problems(spec, max_version) + name_problems(spec)
    if spec.container_edits is not None:
        problems += edit_problems(spec.container_edits, "spec containerEdits")
    if not spec.devices:
        problems.append("the spec defines no devices")
    for dev in spec.devices:
        where = f"device {dev.name!r}"
        if dev.container_edits.is_empty():
            problems.append(f"{where}: containerEdits is empty; a device must change something")
        problems += edit_problems(dev.container_edits, where)
    return problems


def validate_spec(spec: Spec) -> None:
    """Raise CDIError listing every problem, or return if a runtime would accept the spec."""
    problems = spec_problems(spec)
    if problems:
        raise CDIError(f"invalid CDI spec {spec.kind!r}: " + "; ".join(problems))
