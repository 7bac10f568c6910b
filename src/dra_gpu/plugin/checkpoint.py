"""What this node has prepared, kept on disk so that unprepare can undo it after any restart.

Each claim goes through two phases: ``PrepareStarted`` is written before anything is changed on the
node and ``PrepareCompleted`` after, so after a crash a claim's state says whether its setup may be
partial.

Two files hold it, so that a change costs what the claim costs, not what the node holds:

- ``checkpoint.json``, the *snapshot*: versioned and checksummed, always replaced atomically (temp
  file, rename), so a killed plugin leaves the old or the new version, never a mix;
- ``checkpoint.json.journal``: the changes since that snapshot, one line each (a claim's record put
  or dropped, the rebuild flag set), each with its own checksum, appended with one ``write``. Its
  first line names the snapshot it follows; a journal that follows another snapshot (a crash
  between writing a snapshot and starting its journal) is ignored. A last line without its newline
  is a write that a kill interrupted: it never happened, and the next writer cuts it off.

The journal is folded into a new snapshot (``compact``) when it has grown past the snapshot, at
start and at stop, so that neither file grows without bound.

Neither file is fsynced. That would only matter after a power loss, which also takes away most of
what the files describe (GPU settings, MPS daemons, the CDI specs on tmpfs): a snapshot left empty
or torn fails its checksum, a damaged journal line fails its own, and either is set aside and the
state rebuilt; files of a lost write are removed at the next start, and records of claims that are
gone are collected. Skipping the syncs keeps a prepare in the low milliseconds.

A reader finds out whether another process (a second plugin during an update, the usage monitor)
changed the files by comparing the snapshot's first bytes (its checksum) and the journal's first
line (a random id) and length with what it read last: a journal that only grew is read from where
it left off, anything else is read again in full.

The checksums cover the stored JSON as read, not a re-serialisation, so a newer plugin that adds
fields does not make an older one reject the files (the peers' "issue 1080"); unknown fields are
ignored on read. A file that fails its checksum is never fatal: the caller sets it aside and
rebuilds the state (``prepare.Preparer``). Version 1 (the snapshot alone) is still read.

A file of a *newer* format version (a rollback past the release that introduced it) is refused,
never set aside: the newer agent may still be running beside this one, and what the file holds
(the node-side setup of claims in use) cannot be rebuilt without losing track of it. The agent
says so in one line and does not start (``CheckpointTooNew``); docs/upgrades.md lists which
release reads which format.

Records are never changed in place once stored: a change stores a new record, so a caller may
keep a record it read while the files change.

Longer than 500 lines: the two files' format, their reader and writer, and the records they hold are one format;
kept together, a change to it is made in one place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_gpu import __version__
from dra_gpu.plugin.errors import PrepareError, filesystem_error

CHECKPOINT_KIND = "DraGpuCheckpoint"
JOURNAL_KIND = "DraGpuCheckpointJournal"
CHECKPOINT_VERSION = 2
READABLE_VERSIONS = (1, 2)
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
HEAD_BYTES = 160
"""The snapshot's first bytes, which hold its checksum: what tells whether it changed."""
JOURNAL_HEAD_MAX = 512
COMPACT_MIN_BYTES = 256 * 1024
"""A journal smaller than this is never worth folding into the snapshot."""


def current_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot id; tmpfs contents (CDI specs) and GPU settings do not survive a change of it."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class CheckpointCorrupt(Exception):
    """The file cannot be trusted; the message says why."""


class CheckpointTooNew(PrepareError):
    """The files were written by a newer release, in a format this one does not read."""

    def __init__(self, path: Path, version: object) -> None:
        super().__init__(
            f"{path} was written by a newer dra-gpu (checkpoint format {str(version)[:20]}; release "
            f"{__version__} reads formats {', '.join(map(str, READABLE_VERSIONS))}): nothing was changed; run a "
            f"release that reads it (docs/upgrades.md)",
            reason="checkpoint_too_new",
        )


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


def _record_text(record: PreparedClaim) -> str:
    return _canonical(record.model_dump(mode="json", exclude_none=True))


_SAME_FIELDS = tuple(name for name in PreparedClaim.model_fields if name != "state")


StatKey = tuple[int, int, int, int]


def _stat_key(st: os.stat_result) -> StatKey:
    """What changes whenever a file is replaced or written: inode, size, modification and change times."""
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _stat_path(path: Path) -> StatKey | None:
    try:
        return _stat_key(os.stat(path))
    except FileNotFoundError:
        return None


def _read_head(path: Path, size: int) -> bytes | None:
    """The first `size` bytes of `path` and its length; None if it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read(size) + b"@%d" % os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return None


class CheckpointStore:
    """Reads and writes one checkpoint (snapshot and journal); parses only what changed since.

    Not thread-safe by itself: writers hold the node lock, which also covers other processes. A
    reader without it (the usage monitor) may see a change half made; it sees it whole next time.
    ``load()`` returns the store's own object: its records are never changed in place, but the
    mapping of claims changes with every write, so copy it to look at it without the lock.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal_path = path.with_name(f"{path.name}.journal")
        self.reloads = 0
        """How often the files were read in full (at first, and after another process wrote)."""
        self._cached: Checkpoint | None = None
        self._texts: dict[str, str] = {}
        """Claim UID -> its record's canonical JSON as last written or read (for the snapshot)."""
        self._snapshot_head: bytes | None = None
        self._snapshot_checksum = ""
        self._snapshot_bytes = 0
        self._journal_head: bytes | None = None
        """The journal's first line, if it follows the snapshot; None: no journal (or a stale one)."""
        self._journal_end = 0
        """Where the last complete line of the journal ends: what was read, and where the next goes."""
        self._by_gpu: dict[str, dict[str, None]] = {}
        """GPU UUID -> the UIDs of the records with a share on it, in the order first stored."""
        self._by_hold: dict[str, set[str]] = {}
        self._seen: tuple[StatKey | None, StatKey | None] | None = None
        """The files' stat keys (snapshot, journal) when the cached checkpoint was last known to match
        them: unchanged keys mean nothing to read (two stats, instead of opening and reading both)."""

    # -- reading ------------------------------------------------------------------------------------
    @property
    def current(self) -> Checkpoint | None:
        """What the last load or write left (None after a failure): for a caller that knows nobody
        wrote since, such as one still holding the node lock it loaded under."""
        return self._cached

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> Checkpoint:
        """The current checkpoint (empty if there is none); CheckpointCorrupt if it cannot be trusted."""
        try:
            seen = (_stat_path(self.path), _stat_path(self.journal_path))  # before reading: a change
            if self._cached is not None and seen == self._seen:  # meanwhile is seen next time
                return self._cached
            snapshot_head = _read_head(self.path, HEAD_BYTES)
            if self._cached is not None and snapshot_head == self._snapshot_head and self._follow_journal():
                self._seen = seen
                return self._cached
            checkpoint = self._load_all()
            self._seen = seen
            return checkpoint
        except OSError as exc:
            self.invalidate()
            raise filesystem_error("reading the checkpoint", self.path, exc) from None
        except BaseException:
            self.invalidate()
            raise

    def _follow_journal(self) -> bool:
        """Read what was appended to the journal since; False if it is another journal now."""
        try:
            with open(self.journal_path, "rb") as f:
                head = f.readline(JOURNAL_HEAD_MAX)
                if head != self._journal_head:
                    return self._journal_head is None and not self._follows_snapshot(head)
                f.seek(self._journal_end)
                tail = f.read()
        except FileNotFoundError:
            return self._journal_head is None
        self._journal_end += self._apply_lines(tail, self._journal_end)
        return True

    def _follows_snapshot(self, head: bytes) -> bool:
        try:
            document = json.loads(head)
        except ValueError:
            return False
        return isinstance(document, dict) and document.get("base") == self._snapshot_checksum

    def _load_all(self) -> Checkpoint:
        try:
            raw: bytes | None = self.path.read_bytes()
        except FileNotFoundError:
            raw = None
        checkpoint = Checkpoint() if raw is None else self._parse(raw)
        self._cached = checkpoint
        self._texts = {}
        self._snapshot_head = None if raw is None else raw[:HEAD_BYTES] + b"@%d" % len(raw)
        self._snapshot_bytes = 0 if raw is None else len(raw)
        self._journal_head, self._journal_end = None, 0
        self._index()
        if raw is not None:
            try:
                journal = self.journal_path.read_bytes()
            except FileNotFoundError:
                journal = b""
            head, newline, rest = journal.partition(b"\n")
            self._check_journal_version(head)
            if newline and self._follows_snapshot(head + newline):
                self._journal_head = head + newline
                self._journal_end = len(self._journal_head)
                self._journal_end += self._apply_lines(rest, self._journal_end)
        self.reloads += 1
        return checkpoint

    def _check_journal_version(self, head: bytes) -> None:
        """CheckpointTooNew if the journal's first line says a newer format (its entries would be misread)."""
        try:
            version = json.loads(head).get("version")
        except (ValueError, AttributeError):
            return  # not a journal head: ignored as one that follows no snapshot
        if isinstance(version, int) and version > CHECKPOINT_VERSION:
            raise CheckpointTooNew(self.journal_path, version)

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
            raise CheckpointCorrupt(f"kind is {document.get('kind')!r:.80}, expected {CHECKPOINT_KIND!r}")
        version = document.get("version")
        if isinstance(version, int) and version > CHECKPOINT_VERSION:
            raise CheckpointTooNew(self.path, version)
        if version not in READABLE_VERSIONS:
            raise CheckpointCorrupt(
                f"unknown version {version!r:.40} (this plugin reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))})"
            )
        data = document.get("data")
        checksum = _checksum(data)
        if document.get("checksum") != checksum:
            raise CheckpointCorrupt("checksum mismatch (the file was changed or partly written)")
        try:
            checkpoint = Checkpoint.model_validate(data)
        except ValidationError as exc:
            raise CheckpointCorrupt(f"unexpected content: {exc.errors()[0]['msg']}") from None
        self._snapshot_checksum = checksum
        return checkpoint

    def _apply_lines(self, data: bytes, offset: int) -> int:
        """Apply the complete lines of `data` (journal bytes from `offset`); the bytes they take."""
        used = 0
        while True:
            end = data.find(b"\n", used)
            if end < 0:
                return used  # nothing more, or a line a kill cut short: it never happened
            line = data[used : end + 1]
            self._apply(line, offset + used)
            used = end + 1

    def _apply(self, line: bytes, offset: int) -> None:
        where = f"journal line at byte {offset}"
        try:
            document = json.loads(line)
            entry = document["entry"]
            op = entry["op"]
        except (ValueError, KeyError, TypeError):
            raise CheckpointCorrupt(f"{where}: not a journal entry") from None
        if document.get("checksum") != _checksum(entry):
            raise CheckpointCorrupt(f"{where}: checksum mismatch (the file was changed or partly written)")
        assert self._cached is not None
        try:
            if op == "put":
                record = PreparedClaim.model_validate(entry["record"])
                self._set(record, None)
            elif op == "drop":
                self._unset(str(entry["uid"]))
            elif op == "pending":
                self._cached.rebuildPending = bool(entry["value"])
            else:
                raise CheckpointCorrupt(f"{where}: unknown operation {op!r:.40} (written by a newer plugin?)")
        except (ValidationError, KeyError) as exc:
            raise CheckpointCorrupt(f"{where}: unexpected content ({exc.__class__.__name__})") from None

    # -- what callers look up -----------------------------------------------------------------------
    def on_gpu(self, gpu_uuid: str) -> list[PreparedClaim]:
        """The records with a share on the GPU, in the order they were first stored (as of the last load
        or write)."""
        claims = self._cached.claims if self._cached is not None else {}
        return [claims[uid] for uid in self._by_gpu.get(gpu_uuid, ()) if uid in claims]

    def holders(self, key: str) -> set[str]:
        """The UIDs of the records with a hold of `key` (as of the last load or write)."""
        return set(self._by_hold.get(key, ()))

    def held_keys(self) -> set[str]:
        return {key for key, uids in self._by_hold.items() if uids}

    def _index(self) -> None:
        self._by_gpu, self._by_hold = {}, {}
        for record in (self._cached.claims if self._cached is not None else {}).values():
            self._add_index(record)

    def _add_index(self, record: PreparedClaim) -> None:
        for share in record.shares:
            self._by_gpu.setdefault(share.gpu, {})[record.uid] = None
        for hold in record.holds:
            self._by_hold.setdefault(hold.key, set()).add(record.uid)

    def _drop_index(self, record: PreparedClaim, keep: PreparedClaim | None = None) -> None:
        """Forget `record` in the indexes, except where `keep` (its successor) stays."""
        gpus = {s.gpu for s in keep.shares} if keep is not None else set()
        keys = {h.key for h in keep.holds} if keep is not None else set()
        for share in record.shares:
            if share.gpu not in gpus:
                self._by_gpu.get(share.gpu, {}).pop(record.uid, None)
        for hold in record.holds:
            if hold.key not in keys:
                self._by_hold.get(hold.key, set()).discard(record.uid)

    def _set(self, record: PreparedClaim, text: str | None) -> None:
        """Store `record`; a record replaced keeps its place (in the claims and on each GPU)."""
        assert self._cached is not None
        old = self._cached.claims.get(record.uid)
        if old is not None:
            self._drop_index(old, keep=record)
        self._cached.claims[record.uid] = record
        if text is not None:
            self._texts[record.uid] = text
        else:
            self._texts.pop(record.uid, None)
        self._add_index(record)

    def _unset(self, uid: str) -> None:
        assert self._cached is not None
        old = self._cached.claims.pop(uid, None)
        self._texts.pop(uid, None)
        if old is not None:
            self._drop_index(old)

    # -- writing (under the node lock) ----------------------------------------------------------------
    def put(self, record: PreparedClaim, loaded: bool = False) -> None:
        """Store a claim's record (replacing the one of the same UID). `loaded`: the caller loaded the
        checkpoint under the node lock it still holds, so it is not looked at again."""
        if not loaded or self._cached is None:
            self.load()
        text = self._moved_on(record) or _record_text(record)
        self._write(
            '{"op":"put","record":' + text + ',"uid":' + json.dumps(record.uid, ensure_ascii=False) + "}",
            lambda: self._set(record, text),
        )

    def _moved_on(self, record: PreparedClaim) -> str | None:
        """The canonical text of `record` when it is the stored record with only its state changed (a
        prepare's PrepareStarted becoming PrepareCompleted, its other fields the same objects): the
        stored text with the state replaced, instead of serialising the whole record (its CDI spec)
        again. None otherwise."""
        old = self._cached.claims.get(record.uid) if self._cached is not None else None
        text = self._texts.get(record.uid)
        if old is None or text is None or old.state == record.state:
            return None
        if any(getattr(old, name) is not getattr(record, name) for name in _SAME_FIELDS):
            return None
        uid = json.dumps(record.uid, ensure_ascii=False)
        before = f',"state":"{old.state.value}","uid":{uid}}}'  # the last keys of the canonical text
        if not text.endswith(before):
            return None
        return text[: -len(before)] + f',"state":"{record.state.value}","uid":{uid}}}'

    def drop(self, uid: str, loaded: bool = False) -> None:
        if not loaded or self._cached is None:
            self.load()
        if self._cached is not None and uid not in self._cached.claims:
            return
        self._write(_canonical({"op": "drop", "uid": uid}), lambda: self._unset(uid))

    def set_rebuild_pending(self, value: bool) -> None:
        self.load()

        def apply() -> None:
            assert self._cached is not None
            self._cached.rebuildPending = value

        self._write(_canonical({"op": "pending", "value": value}), apply)

    def _write(self, entry: str, apply: Callable[[], None]) -> None:
        """Append one entry to the journal, then `apply` it to the cached checkpoint (just loaded)."""
        if self._journal_head is None:
            self._start_journal()
        line = (
            '{"checksum":"sha256:' + hashlib.sha256(entry.encode()).hexdigest() + '","entry":' + entry + "}\n"
        )
        data = line.encode()
        try:
            fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                if os.fstat(fd).st_size != self._journal_end:
                    os.ftruncate(fd, self._journal_end)  # a line a killed writer left unfinished
                written = os.write(fd, data)
                journal = _stat_key(os.fstat(fd))
            finally:
                os.close(fd)
        except OSError as exc:
            self.invalidate()
            raise filesystem_error("writing the checkpoint journal", self.journal_path, exc) from None
        if written != len(data):
            self.invalidate()
            raise PrepareError(
                f"writing the checkpoint journal {self.journal_path}: only {written} of {len(data)} bytes "
                f"were written (is the file system full?)",
                reason="filesystem",
            )
        self._journal_end += written
        apply()
        if self._seen is not None:
            self._seen = (self._seen[0], journal)

    def _start_journal(self) -> None:
        """A new, empty journal after the current snapshot (written first if there is none)."""
        if self._snapshot_head is None:
            self.save(self._cached or Checkpoint())
        head = (
            json.dumps(
                {"kind": JOURNAL_KIND, "version": CHECKPOINT_VERSION, "base": self._snapshot_checksum},
                separators=(",", ":"),
            )[:-1]
            + f',"id":"{secrets.token_hex(8)}"}}\n'
        ).encode()
        self._replace(self.journal_path, head, "starting the checkpoint journal")
        self._journal_head, self._journal_end = head, len(head)
        self._seen = None

    def compact_due(self, factor: int = 1) -> bool:
        """Whether the journal has outgrown `factor` times the snapshot (and is worth folding into it)."""
        return self._journal_end > factor * max(COMPACT_MIN_BYTES, self._snapshot_bytes)

    def compact(self) -> None:
        """Fold the journal into a new snapshot."""
        checkpoint = self.load()
        if self._journal_head is None and self._snapshot_head is not None:
            return
        self.save(checkpoint)

    def save(self, checkpoint: Checkpoint) -> None:
        """Write `checkpoint` as the new snapshot, with no journal after it."""
        texts = {
            uid: self._texts.get(uid) if self._cached is checkpoint else None for uid in checkpoint.claims
        }
        for uid, record in checkpoint.claims.items():
            if texts[uid] is None:
                texts[uid] = _record_text(record)
        claims = ",".join(
            json.dumps(uid, ensure_ascii=False) + ":" + str(texts[uid]) for uid in sorted(texts)
        )
        canonical = (
            '{"claims":{' + claims + '},"rebuildPending":' + json.dumps(checkpoint.rebuildPending) + "}"
        )
        checksum = _checksum(None, canonical)
        header = json.dumps(
            {"kind": CHECKPOINT_KIND, "version": CHECKPOINT_VERSION, "checksum": checksum},
            separators=(",", ":"),
        )
        data = (header[:-1] + ',"data":' + canonical + "}").encode()
        self._replace(self.path, data, "writing the checkpoint")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.journal_path)
        self._cached = checkpoint
        self._texts = {uid: str(text) for uid, text in texts.items()}
        self._snapshot_head = data[:HEAD_BYTES] + b"@%d" % len(data)
        self._snapshot_checksum, self._snapshot_bytes = checksum, len(data)
        self._journal_head, self._journal_end = None, 0
        self._seen = None  # the next load reads the new files once
        self._index()

    def _replace(self, path: Path, data: bytes, action: str) -> None:
        tmp = path.with_name(f".{path.name}.tmp")  # one writer at a time: the node lock
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            self.invalidate()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise filesystem_error(action, path, exc) from None

    def temp_files(self) -> list[Path]:
        """Temporary files of the snapshot's and the journal's replacements (a kill leaves them)."""
        names = (f".{self.path.name}.tmp", f".{self.journal_path.name}.tmp")
        return [p for p in (self.path.with_name(n) for n in names) if p.exists()]

    def invalidate(self) -> None:
        """Forget the cached copy (after a failed change), so the next load reads the files."""
        self._cached = None
        self._seen = None
        self._snapshot_head = self._journal_head = None
        self._journal_end = 0

    def set_aside(self) -> Path | None:
        """Move untrusted files out of the way (kept for a post-mortem); return where the snapshot went."""
        self.invalidate()
        stamp = f"corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.journal_path, self.journal_path.with_name(f"{self.journal_path.name}.{stamp}"))
        target = self.path.with_name(f"{self.path.name}.{stamp}")
        try:
            os.replace(self.path, target)
        except FileNotFoundError:
            return None
        return target
