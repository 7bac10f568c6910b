"""Whatever prepare accepts, the real limiter library loads; what the library would refuse, prepare refuses.

Each claim is prepared by the agent over gRPC, then the claim's files are mounted where its CDI spec puts
them in a container (in a private mount namespace: the limits file read-only, the state directory as the
spec says) and `limiter-probe` runs under the real library (the tests' build, which reads the claims'
limits files under native/limiter/build/claims). The library's own verdict decides: no error line, and the
claim's limit is what CUDA reports.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_driver import CONTEXT_BYTES, CONTEXT_CHARGE
from plugin_harness import Alloc, Kubelet, PluginDirs, add_claim, gpu_config, opaque, running_plugin, uid_of
from repo_paths import ROOT

from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi.limits import CONTAINER_CLAIMS_ROOT
from dra_gpu.quantity import parse_quantity, to_int

pytestmark = pytest.mark.limiter

LIMITER = ROOT / "native" / "limiter"
GiB = 2**30
FAKE_TOTAL = 80 * GiB
"""The fake driver's memory per GPU: what an unlimited device reports."""
PROFILE = "2xH100-80GB"
GPU0, GPU1 = (g.uuid for g in SimulatedInventory(PROFILE, seed="node-1").gpus())
LONG_NAMESPACE = "n" * 63
LONG_NAME = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
"""The longest a namespace (63) and a ResourceClaim name (253) can be."""


@pytest.fixture(scope="module")
def library(built: Path) -> Path:
    """The tests' build of the library (claims' limits files under build/claims) and the probe."""
    result = subprocess.run(
        ["make", "-C", str(LIMITER), "build/testroot/libdragpu-limiter.so.1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return built


def _unshare() -> list[str]:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare: the claim's files cannot be mounted as a container sees them")
    base = ["unshare", "--mount", "--propagation", "private"]
    return base if os.geteuid() == 0 else [*base, "--map-root-user"]


def run_in_container(
    built: Path, spec: dict[str, Any], uid: str, gpus: list[str]
) -> subprocess.CompletedProcess[str]:
    """`limiter-probe info` with the claim's files mounted as its CDI spec says, under the real library (the
    production build: its claims root is the container's, in a /run of the test's own mount namespace)."""
    mounts = (spec.get("containerEdits") or {}).get("mounts") or []
    script = ["set -e", "mount -t tmpfs tmpfs /run"]
    for mount in mounts:
        target, source = mount["containerPath"], mount["hostPath"]
        if not target.startswith(CONTAINER_CLAIMS_ROOT + "/"):
            continue
        make = (
            f"mkdir -p {shlex.quote(target)}"
            if Path(source).is_dir()
            # A file already there (the region inside its read-only directory) is its own mount point.
            else (
                f"test -e {shlex.quote(target)} || "
                f"{{ mkdir -p {shlex.quote(str(Path(target).parent))} && touch {shlex.quote(target)}; }}"
            )
        )
        script += [make, f"mount --bind {shlex.quote(source)} {shlex.quote(target)}"]
        if "ro" in mount.get("options", []):
            script.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": str(built / "fake"),
        "LD_PRELOAD": str(built / "libdragpu-limiter.so.1"),
        "CUDA_VISIBLE_DEVICES": ",".join(gpus),
    }
    script.append(
        " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        + f" {shlex.quote(str(built / 'limiter-probe'))} info"
    )
    result = subprocess.run(
        [*_unshare(), "sh", "-c", "\n".join(script)], capture_output=True, text=True, check=False, timeout=60
    )
    if result.returncode != 0 and "unshare" in result.stderr and "Operation not permitted" in result.stderr:
        pytest.skip(f"no private mount namespace here: {result.stderr.strip()}")
    return result


def limiter_claim(
    api: FakeKube, name: str, allocs: list[Alloc], namespace: str = "default", **limiter: Any
) -> dict:
    config = gpu_config("Limiter", **({"limiter": limiter} if limiter else {}))
    return add_claim(api, name, allocs, [opaque(config)], namespace=namespace)


def share(device: str, n: int, memory: str | None = "1Gi", cores: str = "10") -> Alloc:
    consumed = None if memory is None else {"memory": memory, "cores": cores}
    return Alloc(device=device, share_id=f"6c000000-0000-4000-8000-{n:012d}", consumed=consumed)


ACCEPTED: dict[str, tuple[dict[str, Any], list[str], int]] = {
    # case: (claim, GPUs the container sees, what CUDA reports on the first of them)
    "plain": ({"allocs": [share("gpu-0", 1, "1Gi")]}, [GPU0], GiB),
    "longest legal namespace and name": (
        {"allocs": [share("gpu-0", 2, "2Gi")], "namespace": LONG_NAMESPACE, "name": LONG_NAME},
        [GPU0],
        2 * GiB,
    ),
    "largest memory limit the library takes": (
        {"allocs": [share("gpu-0", 3, "1Gi")], "memoryLimit": str(2**64 - 1)},
        [GPU0],
        FAKE_TOTAL,
    ),
    "15Ei": ({"allocs": [share("gpu-0", 4, "1Gi")], "memoryLimit": "15Ei"}, [GPU0], FAKE_TOTAL),
    "two GPUs": ({"allocs": [share("gpu-1", 5, "3Gi"), share("gpu-0", 6, "1Gi")]}, [GPU1, GPU0], 3 * GiB),
    "no memory limit, cores only": ({"allocs": [share("gpu-0", 7, None)], "cores": 20}, [GPU0], FAKE_TOTAL),
    "elastic compute: ceiling and priority": (
        {"allocs": [share("gpu-0", 8, "1Gi")], "compute": {"limit": 100, "priority": "latency"}},
        [GPU0],
        GiB,
    ),
}


@pytest.fixture
def plugin_dirs() -> Iterator[PluginDirs]:
    dirs = PluginDirs.create()
    yield dirs
    dirs.cleanup()


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_whatever_prepare_accepts_the_library_loads(
    library: Path, plugin_dirs: PluginDirs, case: str
) -> None:
    claim_args, gpus, total = ACCEPTED[case]
    args = dict(claim_args)
    api = FakeKube()
    claim = limiter_claim(
        api,
        args.pop("name", "claim"),
        args.pop("allocs"),
        namespace=args.pop("namespace", "default"),
        **args,
    )
    with running_plugin(plugin_dirs, api):
        kubelet = Kubelet(plugin_dirs.registration_dir)
        kubelet.register()
        answer = kubelet.prepare(claim)[uid_of(claim)]
        assert answer.error == "", answer.error
        spec = json.loads((plugin_dirs.cdi_dir / f"gpu.dra-gpu.io-claim_{uid_of(claim)}.json").read_text())
        result = run_in_container(library, spec, uid_of(claim), gpus)
        assert result.returncode == 0, result.stderr
        assert "error" not in result.stderr, result.stderr
        # Free is what the probe's own context leaves: its charge under a limit, what the driver took without.
        # The library's no-limit value is the largest byte count; without any limit it charges nothing.
        override = claim_args.get("memoryLimit")
        limited = (
            any(a.consumed for a in claim_args["allocs"])
            if override is None
            else to_int(parse_quantity(override)) < 2**64 - 1
        )
        context = CONTEXT_CHARGE if limited else CONTEXT_BYTES
        assert result.stdout.splitlines()[0] == f"total={total} free={total - context}", (
            result.stdout + result.stderr
        )
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        kubelet.close()


@pytest.mark.parametrize("limit", ["1e63", "999Ei", "16Ei"])
def test_a_memory_limit_past_what_the_library_holds_is_refused_at_prepare(
    library: Path, plugin_dirs: PluginDirs, tmp_path: Path, limit: str
) -> None:
    api = FakeKube()
    claim = limiter_claim(api, "huge", [share("gpu-0", 1, "1Gi")], memoryLimit=limit)
    with running_plugin(plugin_dirs, api):
        kubelet = Kubelet(plugin_dirs.registration_dir)
        kubelet.register()
        error = kubelet.prepare(claim)[uid_of(claim)].error
        kubelet.close()
    assert "more than the limiter can hold (18446744073709551615 bytes, 16 EiB)" in error, error
    assert (
        plugin_dirs.spec_files() == []
        and plugin_dirs.claim_dirs() == []
        and plugin_dirs.checkpoint().claims == {}
    )

    # What the library does with the line an agent that let it through wrote: every allocation refused.
    state = tmp_path / "state"
    state.mkdir()
    limits = tmp_path / "limits"
    limits.write_text(
        f"version=1\nclaim=default/huge\nstate={CONTAINER_CLAIMS_ROOT}/u/limiter\n"
        f"device={GPU0} memory={10**63} cores=10\n"
    )
    spec = {
        "containerEdits": {
            "mounts": [
                {
                    "hostPath": str(limits),
                    "containerPath": f"{CONTAINER_CLAIMS_ROOT}/u/limits",
                    "options": ["ro"],
                },
                {
                    "hostPath": str(state),
                    "containerPath": f"{CONTAINER_CLAIMS_ROOT}/u/limiter",
                    "options": ["rw"],
                },
            ]
        }
    }
    refused = run_in_container(library, spec, "u", [GPU0])
    assert "is not a byte count" in refused.stderr, refused.stderr


def test_a_name_that_would_add_a_line_to_the_limits_file_is_refused(plugin_dirs: PluginDirs) -> None:
    api = FakeKube()
    name = f"x\ndevice={GPU0} memory=unlimited cores=100"
    claim = limiter_claim(api, name, [share("gpu-0", 1, "1Gi")])  # the in-memory API server allows it
    with running_plugin(plugin_dirs, api):
        kubelet = Kubelet(plugin_dirs.registration_dir)
        kubelet.register()
        error = kubelet.prepare(claim)[uid_of(claim)].error
        kubelet.close()
    assert error.startswith("the kubelet sent an invalid claim: name 'x\\ndevice=GPU-"), error
    assert plugin_dirs.claim_dirs() == [] and plugin_dirs.spec_files() == []
