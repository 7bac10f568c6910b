"""A claim's plan, and the interfaces the enforcement backends implement.

Preparing a claim means: for every allocated device (a *share*), collect CDI edits (per device and
claim-wide) and node-side setup (*holds*). Each backend looks at the shares and contributes what its
sharing mode needs; the plan is the sum of the contributions. Holds are recorded in the checkpoint
and undone by their ``HoldHandler`` on unprepare; holds of different claims with the same ``key``
are one GPU-wide setting, released only with the last of them. A new enforcement mechanism is a new
module in this package with a ``BACKEND`` and, if it changes the node, ``HOLD_HANDLERS``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple, Protocol

from cdi.spec import ContainerEdits, Device, DeviceNode, Hook, Mount, Spec
from dra_gpu.config import GpuConfig, Strategy
from dra_gpu.host.driver_root import EXECUTABLE_DIRS, LIBRARY_DIRS, DriverFiles, find_driver_files
from dra_gpu.host.gpu_commands import GpuCommands
from dra_gpu.inventory import GpuInfo
from dra_gpu.inventory.capabilities import LimitHook
from dra_gpu.limiter_abi.limits import DEFAULT_PRIORITY
from dra_gpu.plugin.checkpoint import Hold, PreparedDevice, ShareRecord
from dra_gpu.plugin.errors import PrepareError, describe, os_error_text
from dra_gpu.plugin.identity import is_path_component
from dra_gpu.quantity import to_int

CDI_CLASS = "claim"
CAPACITY_NAMES = ("memory", "cores")
"""The capacities a GPU publishes; a share's consumed amounts of them are recorded."""


@dataclass(frozen=True)
class ClaimInfo:
    uid: str
    namespace: str
    name: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Share:
    """One allocation result of this driver in a claim, with its effective configuration."""

    position: int
    request: str
    """Base request name (`req` for a `req/sub` result), as the kubelet matches containers on it."""
    pool: str
    device: str
    gpu: GpuInfo
    share_id: str | None
    consumed: Mapping[str, Fraction]
    admin_access: bool
    config: GpuConfig
    class_config: GpuConfig | None = None
    """The DeviceClass's configs alone, for what a claim may tighten but not loosen (the watchdog)."""

    @property
    def strategy(self) -> Strategy:
        return self.config.sharing.strategy

    def capacity(self, name: str, driver: str) -> Fraction | None:
        """Consumed capacity `name`, whether the slice spelled it `name` or `<driver>/name`."""
        value = self.consumed.get(name)
        return value if value is not None else self.consumed.get(f"{driver}/{name}")

    def amount(self, name: str, driver: str, configured: int | None) -> int | None:
        """The consumed capacity `name` rounded up to a whole number, else the config's value.

        Consumed capacity is what the scheduler accounted for; the config only stands in where the API
        server has no consumable capacity.
        """
        consumed = self.capacity(name, driver)
        return to_int(consumed) if consumed is not None else configured


class Holder(NamedTuple):
    """Another claim's use of a GPU, as the conflict checks see it (a tuple: a prepare makes one for every
    other share on the GPU, 50 of them on a busy one)."""

    claim: str
    record: ShareRecord


@dataclass(frozen=True)
class DeviceLimit:
    """One GPU's line in the claim's limits file: the claim's pooled memory budget and compute share."""

    memory: int | None
    """Bytes for all processes of all pods of the claim together; None: unlimited."""
    cores: int = 100
    """Percent of the GPU's compute; 100: no compute cap. With elastic compute, the guaranteed floor."""
    ceiling: int | None = None
    """Percent the claim may borrow idle time up to (elastic compute); None: the floor, a fixed share."""
    priority: str = DEFAULT_PRIORITY.value
    """The claim's class in the GPU's arbitration (`limiter_abi.limits.Priority`)."""

    @property
    def top(self) -> int:
        """The ceiling in effect: the set one, or the floor."""
        return self.cores if self.ceiling is None else max(self.ceiling, self.cores)


DRIVER_FILES_RECHECK_S = 1.0
DirectoryStamps = tuple[tuple[int, int, int] | None, ...]
"""(mtime, inode, device) of each directory the driver's files are looked for in; None: absent."""


def _directory_stamps(root: Path) -> DirectoryStamps:
    stamps: list[tuple[int, int, int] | None] = []
    for directory in (*LIBRARY_DIRS, *EXECUTABLE_DIRS):
        try:
            st = os.stat(root / directory)
        except OSError:
            stamps.append(None)
            continue
        stamps.append((st.st_mtime_ns, st.st_ino, st.st_dev))
    return tuple(stamps)


@dataclass
class NodeContext:
    """The node facts and tools that backends and hold handlers need."""

    driver: str
    state_dir: Path
    limiter_library: Path
    dev_root: Path
    commands: GpuCommands
    nvidia_ctk_dirs: Sequence[Path] = ()
    driver_root: Path = Path("/")
    """Where the node's NVIDIA driver files are, as this process sees them."""
    driver_root_host_path: Path | None = None
    """The same directory as the container runtime on the host sees it; None: `driver_root`."""
    ldcache_hook: Path | None = None
    """The installed `update-ldcache` OCI hook (see `driver_root.install_ldcache_hook`)."""
    limit_hook: LimitHook | None = None
    """The memory-limit hook decided at start (`capabilities.find_limit_hook`); None: looked up when needed."""
    _driver_files: dict[str | None, tuple[DirectoryStamps, DriverFiles, float]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def driver_files(self, version: str | None = None) -> DriverFiles:
        """The driver's files under the driver root, looked for again only when one of the directories
        they are looked for in changed (a driver upgrade; looked at once a second at most): listing
        them for every claim cost more than the rest of a prepare. With `version`, only the libraries of
        exactly that driver (what NVML reports: an older driver's leftover would not match the kernel)."""
        cached = self._driver_files.get(version)
        now = time.monotonic()
        if cached is not None and now - cached[2] < DRIVER_FILES_RECHECK_S:
            return cached[1]
        stamps = _directory_stamps(self.driver_root)
        if cached is not None and cached[0] == stamps:
            self._driver_files[version] = (stamps, cached[1], now)
            return cached[1]
        files = find_driver_files(self.driver_root, version)
        # A directory changed in the last second may change again within its timestamp's resolution.
        settled = time.time() - 1.0
        if all(s is None or s[0] < settled * 1e9 for s in stamps):
            self._driver_files[version] = (stamps, files, now)
        return files

    def claim_dir(self, uid: str) -> Path:
        """The claim's directory under the state directory; a UID that is no file name never gets one."""
        if not is_path_component(uid):
            raise PrepareError(f"not a claim UID for a directory name: {uid[:64]!r}", reason="invalid_claim")
        return self.state_dir / "claims" / uid


@dataclass
class Edits:
    """CDI container edits being assembled; env keys are unique, later mounts/nodes replace earlier."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    device_nodes: list[DeviceNode] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)

    def add_mount(self, host_path: Path | str, container_path: str, options: list[str]) -> None:
        self.mounts = [m for m in self.mounts if m.container_path != container_path]
        self.mounts.append(Mount(host_path=str(host_path), container_path=container_path, options=options))

    def add_device_node(self, node: DeviceNode) -> None:
        if all(n.path != node.path for n in self.device_nodes):
            self.device_nodes.append(node)

    def to_cdi(self) -> ContainerEdits:
        return ContainerEdits(
            env=[f"{k}={v}" for k, v in self.env.items()] or None,
            mounts=list(self.mounts) or None,
            device_nodes=list(self.device_nodes) or None,
            hooks=list(self.hooks) or None,
        )


@dataclass
class Plan:
    """Everything preparing one claim will do; built by the backends, then applied by the preparer."""

    claim: ClaimInfo
    shares: list[Share]
    driver: str
    device_edits: dict[int, Edits] = field(default_factory=dict)
    claim_edits: Edits = field(default_factory=Edits)
    extra_cdi_ids: dict[int, list[str]] = field(default_factory=dict)
    holds: list[Hold] = field(default_factory=list)
    details: dict[int, dict[str, str]] = field(default_factory=dict)
    limits: dict[str, DeviceLimit] = field(default_factory=dict)
    """GPU UUID -> the claim's limiter budget on it; the limiter backend writes the claim's limits file."""
    notices: list[str] = field(default_factory=list)
    """What a user of the claim must know about how its limits hold (posted as events on the claim)."""

    def __post_init__(self) -> None:
        for share in self.shares:
            self.device_edits.setdefault(share.position, Edits())

    # -- for backends ----------------------------------------------------------------------------
    def sharing(self, strategy: Strategy) -> list[Share]:
        """The shares of one strategy; admin-access results get device access only, never sharing setup."""
        return [s for s in self.shares if s.strategy == strategy and not s.admin_access]

    def visible_gpus(self) -> list[GpuInfo]:
        """The claim's distinct GPUs in result order: the order of CUDA ordinals in the container."""
        seen: dict[str, GpuInfo] = {}
        for share in self.shares:
            seen.setdefault(share.gpu.uuid, share.gpu)
        return list(seen.values())

    def ordinal(self, gpu: GpuInfo) -> int:
        return [g.uuid for g in self.visible_gpus()].index(gpu.uuid)

    def edits(self, share: Share) -> Edits:
        return self.device_edits[share.position]

    def hold(self, kind: str, key: str, **params: str | int) -> None:
        """Ask for node-side setup; asking twice for the same key in one claim is one hold."""
        if all(h.key != key for h in self.holds):
            self.holds.append(Hold(kind=kind, key=key, params=dict(params)))

    def limit(
        self,
        gpu: GpuInfo,
        memory: int | None,
        cores: int = 100,
        ceiling: int | None = None,
        priority: str = DEFAULT_PRIORITY.value,
    ) -> None:
        """Add a budget on `gpu` to the claim's limits file (several contributions add up: floors and
        ceilings sum, the first contribution's priority stays)."""
        old = self.limits.get(gpu.uuid)
        if old is not None:
            memory = None if old.memory is None or memory is None else old.memory + memory
            top = cores if ceiling is None else max(ceiling, cores)
            both = old.cores < 100 and cores < 100
            ceiling = min(old.top + top, 100) if both and (old.ceiling, ceiling) != (None, None) else None
            cores = min(old.cores + cores, 100) if both else 100
            priority = old.priority
        cores = min(max(cores, 1), 100)
        ceiling = None if ceiling is None or ceiling <= cores else min(ceiling, 100)
        self.limits[gpu.uuid] = DeviceLimit(memory=memory, cores=cores, ceiling=ceiling, priority=priority)

    def notice(self, text: str) -> None:
        if text not in self.notices:
            self.notices.append(text)

    def detail(self, share: Share, name: str, value: str) -> None:
        """Record a fact about the share that later claims' conflict checks need (e.g. the interval)."""
        self.details.setdefault(share.position, {})[name] = value

    # -- results ---------------------------------------------------------------------------------
    def cdi_device_name(self, share: Share) -> str:
        """`<claimUID>-<device>`; a second share of the same device in one claim adds its share id."""
        earlier = [s for s in self.shares if s.device == share.device and s.position < share.position]
        suffix = f"-{share.share_id or share.position}" if earlier else ""
        return f"{self.claim.uid}-{share.device}{suffix}"

    def cdi_id(self, share: Share) -> str:
        return f"{self.driver}/{CDI_CLASS}={self.cdi_device_name(share)}"

    def cdi_spec(self) -> Spec:
        claim_edits = self.claim_edits.to_cdi()
        return Spec(
            kind=f"{self.driver}/{CDI_CLASS}",
            devices=[
                Device(name=self.cdi_device_name(s), container_edits=self.edits(s).to_cdi())
                for s in self.shares
            ],
            container_edits=None if claim_edits.is_empty() else claim_edits,
        )

    def answer(self) -> list[PreparedDevice]:
        return [
            PreparedDevice(
                requestNames=[s.request],
                pool=s.pool,
                device=s.device,
                cdiDeviceIds=[self.cdi_id(s), *self.extra_cdi_ids.get(s.position, [])],
                shareId=s.share_id,
            )
            for s in self.shares
        ]

    def share_records(self) -> list[ShareRecord]:
        return [
            ShareRecord(
                device=s.device,
                gpu=s.gpu.uuid,
                strategy=s.strategy.value,
                shareId=s.share_id,
                adminAccess=s.admin_access,
                detail=self.details.get(s.position, {}),
                consumed={
                    name: str(amount)
                    for name in CAPACITY_NAMES
                    if (amount := s.capacity(name, self.driver)) is not None
                },
            )
            for s in self.shares
        ]


class Backend(Protocol):
    """One enforcement mechanism (or device access itself)."""

    name: str
    order: int
    """Contributions are made in ascending order (device access first)."""

    def conflict(self, share: Share, others: Sequence[Holder]) -> str | None:
        """Why `share` cannot join the GPU's other holders, or None. `others` excludes admin access."""
        ...

    def contribute(self, plan: Plan, node: NodeContext) -> None:
        """Add edits, holds and details for the shares this backend handles; PrepareError if impossible."""
        ...


class HoldHandler(Protocol):
    kind: str

    def apply(self, hold: Hold, node: NodeContext) -> None:
        """Make the setting true; must be idempotent (it runs again after crashes and reboots)."""
        ...

    def release(self, hold: Hold, node: NodeContext, last: bool) -> None:
        """Undo; `last` is False while another prepared claim holds the same key."""
        ...

    def in_place(self, hold: Hold, node: NodeContext) -> bool:
        """False if the setting has gone away behind our back (a daemon died); the supervisor re-applies."""
        ...

    def reset_unheld(self, gpu: GpuInfo, node: NodeContext, held: Set[str]) -> None:
        """Undo this kind's GPU-wide setting on `gpu` if no key in `held` (every prepared claim's holds)
        asks for it: after the checkpoint was rebuilt, nobody else knows it is there. CommandError
        is logged by the caller; a per-claim kind does nothing here."""
        ...


def setup_failed(what: str, exc: Exception) -> PrepareError:
    """`what` failed because of `exc`; a file error in words (`Permission denied (EACCES)`), naming
    its file unless `what` does."""
    detail = str(exc)
    if isinstance(exc, OSError):
        detail = os_error_text(exc) if exc.filename is None or str(exc.filename) in what else describe(exc)
    return PrepareError(f"{what}: {detail}", reason="setup_failed")
