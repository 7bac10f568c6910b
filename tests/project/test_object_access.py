"""Kubernetes objects are read through `dra_gpu.kube.objects` (its accessors, `DeviceResult`, `DeviceRequest`)
and written through `dra_gpu.kube.builders`, not by key.

Outside `kube/`, a read of `metadata`, `spec` or `status` by key (`obj["spec"]`, `obj.get("status")`) is a
second, differently tolerant reading of a field `kube/objects.py` already reads, and a write by key is a
second, differently shaped object; so the driver (`src/dra_gpu/`), its benchmarks (`bench/`) and its GPU
checks (`gpucheck/`) have none.
"""

from __future__ import annotations

import re
from collections import Counter

from repo_paths import ROOT

SRC = ROOT / "src" / "dra_gpu"
TREES = (SRC, ROOT / "bench", ROOT / "gpucheck")
BY_KEY = re.compile(r'\[\s*"(metadata|spec|status)"\s*\]|\.get\(\s*"(metadata|spec|status)"')

NOT_OBJECTS = {
    "gpucheck/checks/nodepath.py": "reads the node-path program's JSON report, whose `status` is pass or fail",
}
"""Files whose reads by key are of something other than a Kubernetes object, with why."""


def reads_by_key() -> Counter[str]:
    found: Counter[str] = Counter()
    for tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            if path.is_relative_to(SRC) and path.relative_to(SRC).parts[0] in ("kube", "_proto"):
                continue
            relative = path.relative_to(ROOT).as_posix()
            count = len(BY_KEY.findall(path.read_text()))
            if count and relative not in NOT_OBJECTS:
                found[relative] = count
    return found


def test_objects_are_read_and_written_through_kube_only() -> None:
    assert reads_by_key() == {}, (
        "read these fields through dra_gpu.kube.objects and build or change objects with dra_gpu.kube.builders "
        "(add an accessor or a builder there if none fits)"
    )


def test_the_pattern_sees_reads_and_not_accessors() -> None:
    text = 'a = obj["spec"]; b = obj.get("status") or {}; c = objects.spec(obj); d = x.get("specs")'
    assert len(BY_KEY.findall(text)) == 2


def test_every_exception_names_a_file_that_reads_by_key() -> None:
    for relative in NOT_OBJECTS:
        assert BY_KEY.search((ROOT / relative).read_text()), f"{relative} no longer needs its exception"
