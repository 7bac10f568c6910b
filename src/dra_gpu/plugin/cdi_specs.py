"""One transient CDI spec file per prepared claim: `<driver>-claim_<claimUID>.json` in the CDI directory."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from cdi import files
from cdi.spec import Spec
from dra_gpu.plugin.identity import is_path_component
from dra_gpu.plugin.sharing.plan import CDI_CLASS


class ClaimSpecs:
    def __init__(self, cdi_dir: Path, driver: str) -> None:
        self.cdi_dir = cdi_dir
        self.driver = driver
        self._prefix = f"{driver}-{CDI_CLASS}_"

    def path(self, uid: str) -> Path:
        return Path(self._file(uid))

    def _file(self, uid: str) -> str:
        if not is_path_component(uid):
            raise ValueError(f"not a claim UID for a file name: {uid[:64]!r}")
        return os.path.join(self.cdi_dir, files.transient_spec_name(self.driver, CDI_CLASS, uid))

    def exists(self, uid: str) -> bool:
        return os.path.isfile(self._file(uid))

    def write(self, uid: str, spec: Spec | dict[str, Any]) -> Path:
        self._file(uid)  # a UID that is no file name goes no further
        model = spec if isinstance(spec, Spec) else Spec.model_validate(spec)
        return files.write_spec(self.cdi_dir, model, uid)

    def remove(self, uid: str) -> bool:
        """Remove the claim's spec; False if it was not there. (Temporary files of an interrupted
        write are the stale-claim sweep's: looking for them here would read the whole directory.)"""
        try:
            os.unlink(self._file(uid))
        except FileNotFoundError:
            return False
        with contextlib.suppress(OSError):
            fd = os.open(self.cdi_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return True

    def temp_files(self) -> list[Path]:
        """Our specs' temporary files (`.<spec name>.XXXX.tmp`), which only an interrupted write leaves."""
        try:
            names = os.listdir(self.cdi_dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        prefix = "." + self._prefix
        return [self.cdi_dir / n for n in names if n.startswith(prefix) and n.endswith(files.TEMP_SUFFIX)]

    def uids_on_disk(self) -> set[str]:
        """Claim UIDs that have a spec file of ours, e.g. to find leftovers after losing the checkpoint."""
        try:
            names = os.listdir(self.cdi_dir)
        except (FileNotFoundError, NotADirectoryError):
            return set()
        found = set()
        for name in names:
            stem, ext = os.path.splitext(name)
            if name.startswith(self._prefix) and ext in files.SPEC_EXTENSIONS:
                found.add(stem[len(self._prefix) :])
        return found
