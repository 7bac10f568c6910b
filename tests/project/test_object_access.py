"""Kubernetes objects are read through `dra_gpu.kube.objects` (its accessors and `DeviceResult`), not by key.

Outside `kube/`, a read of `metadata`, `spec` or `status` by key (`obj["spec"]`, `obj.get("status")`) is a
second, differently tolerant reading of a field `kube/objects.py` already reads. `ALLOWED` lists the places
left from before the rule, file by file; it only shrinks: a file that reads fewer fails until its line is
lowered (or removed), and a file not listed may read none.
"""

from __future__ import annotations

import re
from collections import Counter

from repo_paths import ROOT

SRC = ROOT / "src" / "dra_gpu"
BY_KEY = re.compile(r'\[\s*"(metadata|spec|status)"\s*\]|\.get\(\s*"(metadata|spec|status)"')

ALLOWED = {
    "allocator/__init__.py": 1,
    "allocator/pools.py": 2,
    "commands/slices.py": 1,
    "controller/leader.py": 3,
    "controller/reconciler.py": 8,
    "demo/kubelet.py": 1,
    "demo/mig_step.py": 6,
    "demo/run.py": 9,
    "demo/scheduler.py": 22,
    "manifests/classes.py": 1,
    "plugin/claims.py": 1,
    "slices/dropped.py": 4,
    "slices/publisher.py": 6,
}
"""Reads by key left, per file of src/dra_gpu/ (writes of a built object count too: build it in kube/)."""


def reads_by_key() -> Counter[str]:
    found: Counter[str] = Counter()
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC)
        if relative.parts[0] in ("kube", "_proto"):
            continue
        count = len(BY_KEY.findall(path.read_text()))
        if count:
            found[relative.as_posix()] = count
    return found


def test_objects_are_read_through_kube_objects_and_the_allow_list_only_shrinks() -> None:
    found = reads_by_key()
    new = {path: count for path, count in found.items() if count > ALLOWED.get(path, 0)}
    assert new == {}, "read these fields through dra_gpu.kube.objects (add an accessor there if none fits)"
    fewer = {path: found.get(path, 0) for path, count in ALLOWED.items() if found.get(path, 0) < count}
    assert fewer == {}, "fewer reads by key than ALLOWED says: lower these lines of ALLOWED (remove at 0)"


def test_the_pattern_sees_reads_and_not_accessors() -> None:
    text = 'a = obj["spec"]; b = obj.get("status") or {}; c = objects.spec(obj); d = x.get("specs")'
    assert len(BY_KEY.findall(text)) == 2
