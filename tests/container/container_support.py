"""Hand the CDI ids that prepare returned to a real OCI runtime and look at what the container gets.

podman (with runc) is the runtime: it reads the CDI specs the plugin wrote, refuses what it cannot
load, injects the rest. Nothing here interprets a spec the way our own resolver does; the only
reading of specs on our side is the pre-flight check, which predicts a refusal before a container
starts so that a failure names the spec file and the problem rather than "unresolvable CDI devices".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cdi.errors import CDIError
from cdi.files import SPEC_EXTENSIONS, read_spec
from cdi.names import parse_qualified_name
from cdi.runtime_check import DEFAULT_MAX_VERSION, check_spec_for_runtime

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_TOOL = REPO_ROOT / "tools" / "container-image.sh"

RUNTIME_CDI_DIR = Path("/var/run/cdi")
"""The dynamic CDI directory every runtime reads. podman 4.3 has no flag for another one and ignores
``cdi_spec_dirs`` in a containers.conf, so the tests' plugin writes its per-claim specs here."""

RUNTIME = "runc"
"""crun, podman's default, refuses cgroups in hybrid mode on machines of this kind; runc works."""

RUN_FLAGS: tuple[str, ...] = (
    "--network",
    "none",
    # runc cannot raise rlimits without CAP_SYS_RESOURCE; these stay below the defaults.
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=4096:4096",
)

UNRESOLVABLE = "unresolvable CDI devices"
"""What podman says when a requested CDI id is in no spec it could load."""


def podman_missing_reason() -> str | None:
    """Why the container tests cannot run here, or None when they can."""
    if shutil.which("podman") is None:
        return "podman is not installed (Debian: apt-get install podman runc busybox-static)"
    if os.geteuid() != 0:
        return (
            f"the container tests need root: rootful podman, and the plugin's specs go to {RUNTIME_CDI_DIR}"
        )
    return None


@contextlib.contextmanager
def host_lock(path: Path = RUNTIME_CDI_DIR.parent / "dra-gpu-container-tests.lock") -> Iterator[None]:
    """One container-test session per host at a time: each one's plugin removes the test driver's
    spec files that it did not write (leftovers, as far as it can tell), which would pull the CDI
    devices from under another session's containers."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class SpecRefused(AssertionError):
    """A spec a real runtime would refuse (or an id it could not resolve), found before starting it."""


def _spec_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in SPEC_EXTENSIONS and p.is_file())


def specs_providing(cdi_dir: Path, cdi_ids: Iterable[str]) -> dict[str, Path]:
    """The spec file in ``cdi_dir`` that defines each id; raises SpecRefused for one that none does."""
    wanted = {i: parse_qualified_name(i) for i in cdi_ids}
    found: dict[str, Path] = {}
    unreadable: list[str] = []
    for path in _spec_files(cdi_dir):
        try:
            spec = read_spec(path)
        except CDIError as e:
            unreadable.append(str(e))  # a runtime skips such a file: only worth naming if an id is missing
            continue
        for cdi_id, (vendor, cls, name) in wanted.items():
            if spec.kind == f"{vendor}/{cls}" and any(d.name == name for d in spec.devices):
                found.setdefault(cdi_id, path)
    missing = sorted(set(wanted) - set(found))
    if missing:
        message = f"no CDI spec in {cdi_dir} defines {', '.join(missing)}"
        if unreadable:
            message += "; runtimes skip these spec files:\n  " + "\n  ".join(unreadable)
        raise SpecRefused(message)
    return found


def preflight(
    cdi_dir: Path,
    cdi_ids: Iterable[str],
    max_version: str = DEFAULT_MAX_VERSION,
    host_root: Path = Path("/"),
) -> None:
    """Raise SpecRefused naming every problem a runtime would have with the specs behind ``cdi_ids``."""
    problems: list[str] = []
    for path in sorted(set(specs_providing(cdi_dir, cdi_ids).values())):
        problems += [f"{path.name}: {p}" for p in check_spec_for_runtime(path, max_version, host_root)]
    if problems:
        raise SpecRefused("a container runtime would refuse these CDI specs:\n  " + "\n  ".join(problems))


def build_image(*elves: Path) -> str:
    """The local test image (built by ``tools/container-image.sh`` when missing); its reference."""
    proc = subprocess.run(
        [str(IMAGE_TOOL), *map(str, elves)], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{IMAGE_TOOL.name} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Volume:
    """A bind mount the test adds itself (the stand-in for what the NVIDIA toolkit would inject)."""

    host: Path
    container: str
    read_only: bool = True

    def arg(self) -> str:
        return f"{self.host}:{self.container}:{'ro' if self.read_only else 'rw'}"


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> Result:
        if self.returncode != 0:
            raise AssertionError(
                f"container failed ({self.returncode}): {shlex.join(self.argv)}\n"
                f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}"
            )
        return self

    def section(self, name: str) -> list[str]:
        """Lines between ``== name ==`` and the next section marker (see :func:`sections`)."""
        out: list[str] = []
        inside = False
        for line in self.stdout.splitlines():
            if line.startswith("== ") and line.endswith(" =="):
                inside = line == f"== {name} =="
            elif inside:
                out.append(line)
        return out

    def env(self, section: str = "env") -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.section(section) if "=" in line)


def sections(**commands: str) -> str:
    """A shell script printing each command's output under a ``== name ==`` marker."""
    return "; ".join(f"echo '== {name} =='; {cmd}" for name, cmd in commands.items())


def probe_allocated(lines: list[str]) -> tuple[int, str]:
    """(bytes, last result) from the allocation probe's ``allocated=<bytes> last=<code>`` line."""
    for line in lines:
        match = re.fullmatch(r"allocated=(\d+) last=(\S+)", line)
        if match:
            return int(match[1]), match[2]
    raise AssertionError(f"no 'allocated=' line in the probe's output: {lines}")


@dataclass
class Podman:
    """podman with the flags machines of this kind need, run against the plugin's CDI directory."""

    image: str
    cdi_dir: Path = RUNTIME_CDI_DIR
    runtime: str = RUNTIME

    def argv(
        self,
        script: str,
        devices: Sequence[str] = (),
        volumes: Sequence[Volume] = (),
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        read_only: bool = False,
    ) -> list[str]:
        argv = ["podman", "--runtime", self.runtime, "run", "--rm", *RUN_FLAGS]
        if name:
            argv += ["--name", name]
        if read_only:
            argv += ["--read-only"]  # the root filesystem, as a pod's readOnlyRootFilesystem
        for device in devices:
            argv += ["--device", device]
        for volume in volumes:
            argv += ["-v", volume.arg()]
        for key, value in (env or {}).items():
            argv += ["--env", f"{key}={value}"]
        return [*argv, self.image, "sh", "-c", script]

    def run(
        self,
        script: str,
        devices: Sequence[str] = (),
        volumes: Sequence[Volume] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
        check_specs: bool = True,
        read_only: bool = False,
    ) -> Result:
        """Run ``script`` in a fresh container; the specs are checked first unless told otherwise."""
        if check_specs and devices:
            preflight(self.cdi_dir, devices)
        argv = self.argv(script, devices, volumes, env, read_only=read_only)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        return Result(argv, proc.returncode, proc.stdout, proc.stderr)

    @contextlib.contextmanager
    def background(
        self,
        script: str,
        devices: Sequence[str] = (),
        volumes: Sequence[Volume] = (),
        env: Mapping[str, str] | None = None,
    ) -> Iterator[Background]:
        """A container left running while the block runs; removed (killed if need be) afterwards."""
        preflight(self.cdi_dir, devices)
        name = f"dra-gpu-test-{uuid.uuid4().hex[:12]}"
        argv = self.argv(script, devices, volumes, env, name=name)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            yield Background(name, argv, proc)
        finally:
            if proc.poll() is None:
                subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, check=False)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=30)
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@dataclass
class Background:
    name: str
    argv: list[str]
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def read_until(self, marker: str) -> list[str]:
        """Output lines up to and including ``marker``; fails with all output if the container exits first."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.rstrip("\n") == marker:
                return list(self.lines)
        stderr = self.proc.stderr.read() if self.proc.stderr else ""
        raise AssertionError(
            f"container {self.name} exited ({self.proc.wait()}) before printing {marker!r}\n"
            f"stdout:\n" + "\n".join(self.lines) + f"\nstderr:\n{stderr}"
        )

    def kill(self) -> int:
        """SIGKILL the container's processes, as an evicted pod's are, and wait for podman to exit."""
        subprocess.run(["podman", "kill", "--signal", "KILL", self.name], capture_output=True, check=False)
        self.proc.communicate(timeout=60)
        return self.proc.returncode


def mount_options(mountinfo: Iterable[str], container_path: str) -> set[str]:
    """Per-mount options (``ro``/``rw``, ...) of the mount at ``container_path`` in /proc/self/mountinfo."""
    options: set[str] | None = None
    for line in mountinfo:
        fields = line.split()
        if len(fields) > 5 and fields[4] == container_path:
            options = set(fields[5].split(","))  # the last mount on a path is the one seen
    if options is None:
        raise AssertionError(f"{container_path} is not a mount point in the container")
    return options
