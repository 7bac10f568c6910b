"""A limiter library meeting a claim's file of a layout it does not know (a newer agent's limits file, a region
of another library version) refuses it in one line, and the claim's devices get no memory rather than a wrong
cap (docs/upgrades.md, "Layouts"). Each file of the claim is given the next layout version in turn; the probe
runs as a container of the claim would (`run_in_container`)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from plugin_harness import Kubelet, PluginDirs, running_plugin, uid_of
from test_plugin_limiter_library import GPU0, library, limiter_claim, plugin_dirs, run_in_container, share

from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi.limits import LIMITS_VERSION
from dra_gpu.limiter_abi.region import VERSION as REGION_VERSION

pytestmark = pytest.mark.limiter
__all__ = ["library", "plugin_dirs"]  # fixtures of the module they come from


def next_limits_layout(claim_dir: Path) -> None:
    path = claim_dir / "limits"
    text = path.read_text().replace(f"version={LIMITS_VERSION}\n", f"version={LIMITS_VERSION + 1}\n")
    os.chmod(path, 0o644)
    path.write_text(text)


def next_region_layout(claim_dir: Path) -> None:
    (region,) = claim_dir.rglob("*.region")
    with open(region, "r+b") as f:
        f.seek(8)  # magic (8 bytes), then the layout version
        f.write(struct.pack("<I", REGION_VERSION + 1))


REFUSALS = {
    "limits": (
        next_limits_layout,
        f"unsupported version {LIMITS_VERSION + 1} (this library reads {LIMITS_VERSION})",
    ),
    "region": (
        next_region_layout,
        "it was made for another version of the library (the claim must be prepared again)",
    ),
}


@pytest.mark.parametrize("file", list(REFUSALS))
def test_a_file_of_an_unknown_layout_is_refused_in_one_line(
    library: Path, plugin_dirs: PluginDirs, file: str
) -> None:
    change, why = REFUSALS[file]
    api = FakeKube()
    claim = limiter_claim(api, "claim", [share("gpu-0", 1, "1Gi")])
    with running_plugin(plugin_dirs, api):
        kubelet = Kubelet(plugin_dirs.registration_dir)
        kubelet.register()
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        spec = json.loads((plugin_dirs.cdi_dir / f"gpu.dra-gpu.io-claim_{uid_of(claim)}.json").read_text())
        change(plugin_dirs.state_dir / "claims" / uid_of(claim))
        result = run_in_container(library, spec, uid_of(claim), [GPU0])
        kubelet.close()
    lines = [line for line in result.stderr.splitlines() if line.startswith("dragpu-limiter:")]
    assert len(lines) == 1 and why in lines[0], result.stderr
    assert lines[0].startswith("dragpu-limiter: error: ") and "refusing allocations on" in lines[0], lines[0]
