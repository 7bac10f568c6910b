"""What this node has prepared, kept on disk so that unprepare can undo it after any restart.

Each claim goes through two phases: ``PrepareStarted`` is written before anything is changed on the
node and ``PrepareCompleted`` after, so after a crash a claim's state says whether its setup may be
partial.

The file is versioned and checksummed and always replaced atomically (temp file, rename): a killed
plugin leaves the old or the new version, never a mix. It is not fsynced. That would only matter
after a power loss, which also takes away most of what the file describes (GPU settings, MPS
daemons, the CDI specs on tmpfs): a file left empty or torn fails its checksum and is rebuilt, files
of a lost write are removed at the next start, and records of claims that are gone are collected.
Skipping the syncs keeps a prepare in the low milliseconds.

The checksum covers the stored JSON as read, not a re-serialisation, so a newer plugin that adds
fields does not make an older one reject the file (the peers' "issue 1080"); unknown fields are
ignored on read. A file that fails its checksum or has an unknown version is never fatal: the
caller sets it aside and rebuilds the state (``prepare.Preparer``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

CHECKPOINT_KIND = "DraGpuCheckpoint"
CHECKPOINT_VERSION = 1
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def current_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot id; tmpfs contents (CDI specs) and GPU settings do not survive a change of it."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class CheckpointCorrupt(Exception):
    """The file cannot be trusted; the message says why."""


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Hold(_Model):
    """One piece of node-side setup, undone on unprepare.

    ``key`` names the resource: holds with the same key (e.g. ``mps:GPU-...``) are one GPU-wide
    setting shared by several claims, released only when the last holder goes.
    """

    kind: str
    key: str
    params: dict[str, str | int] = Field(default_factory=dict)


class PreparedDevice(_Model):
    """One entry of the answer given to the kubelet."""

    requestNames: list[str]
    pool: str
    device: str
    cdiDeviceIds: list[str]
    shareId: str | None = None


class ShareRecord(_Model):
    """How a claim uses a GPU, for the conflict checks of later claims on the same GPU."""

    device: str
    gpu: str
    strategy: str
    shareId: str | None = None
    adminAccess: bool = False
    detail: dict[str, str] = Field(default_factory=dict)
    consumed: dict[str, str] = Field(default_factory=dict)
    """The share's consumed capacity (`memory`, `cores`), for the node's own capacity check."""


class PreparedClaim(_Model):
    uid: str
    namespace: str
    name: str
    state: ClaimState
    bootId: str = ""
    devices: list[PreparedDevice] = Field(default_factory=list)
    shares: list[ShareRecord] = Field(default_factory=list)
    holds: list[Hold] = Field(default_factory=list)
    cdiSpec: dict[str, Any] | None = None
    """The claim's CDI spec as written, so it can be rewritten without the API (after a reboot)."""
    allocation: str | None = None
    """Digest of this driver's part of the allocation it was prepared from (``claims.allocation_digest``)."""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class Checkpoint(_Model):
    claims: dict[str, PreparedClaim] = Field(default_factory=dict)
    rebuildPending: bool = False
    """The file was rebuilt without the API: claims in use may be missing, files must not be pruned."""


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _checksum(data: Any, canonical: str | None = None) -> str:
    text = _canonical(data) if canonical is None else canonical
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class CheckpointStore:
    """Reads and writes one checkpoint file; parses it again only when its bytes changed.

    Comparing bytes rather than inode and mtime keeps two processes honest even when a file
    system's coarse timestamps and inode reuse make two versions look alike. Not thread-safe by
    itself: callers hold the node lock, which also covers other processes.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cached: Checkpoint | None = None
        self._raw: bytes | None = None

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> Checkpoint:
        """The current checkpoint (empty if there is none); CheckpointCorrupt if it cannot be trusted."""
        try:
            raw: bytes | None = self.path.read_bytes()
        except FileNotFoundError:
            raw = None
        if self._cached is not None and raw == self._raw:
            return self._cached
        checkpoint = Checkpoint() if raw is None else self._parse(raw)
        self._cached, self._raw = checkpoint, raw
        return checkpoint

    def _parse(self, raw: bytes) -> Checkpoint:
        if not raw.strip():
            raise CheckpointCorrupt("the file is empty")
        try:
            document = json.loads(raw)
        except ValueError as exc:
            raise CheckpointCorrupt(f"not JSON ({exc})") from None
        if not isinstance(document, dict):
            raise CheckpointCorrupt("not a JSON object")
        if document.get("kind") != CHECKPOINT_KIND:
            raise CheckpointCorrupt(f"kind is {document.get('kind')!r}, expected {CHECKPOINT_KIND!r}")
        version = document.get("version")
        if version != CHECKPOINT_VERSION:
            raise CheckpointCorrupt(
                f"unknown version {version!r} (this plugin reads version {CHECKPOINT_VERSION})"
            )
        data = document.get("data")
        if document.get("checksum") != _checksum(data):
            raise CheckpointCorrupt("checksum mismatch (the file was changed or partly written)")
        try:
            return Checkpoint.model_validate(data)
        except ValidationError as exc:
            raise CheckpointCorrupt(f"unexpected content: {exc.errors()[0]['msg']}") from None

    def save(self, checkpoint: Checkpoint) -> None:
        data = checkpoint.model_dump(mode="json", exclude_none=True)
        canonical = _canonical(data)
        header = json.dumps(
            {"kind": CHECKPOINT_KIND, "version": CHECKPOINT_VERSION, "checksum": _checksum(data, canonical)},
            separators=(",", ":"),
        )
        text = header[:-1] + ',"data":' + canonical + "}"

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")  # one writer at a time: the node lock
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            self.invalidate()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._cached, self._raw = checkpoint, text.encode()

    def invalidate(self) -> None:
        """Forget the cached copy (after a failed change), so the next load parses the file."""
        self._cached = self._raw = None

    def set_aside(self) -> Path | None:
        """Move an untrusted file out of the way (kept for a post-mortem); return where it went."""
        self.invalidate()
        target = self.path.with_name(
            f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        )
        try:
            os.replace(self.path, target)
        except FileNotFoundError:
            return None
        return target
