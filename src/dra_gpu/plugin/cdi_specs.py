"""One transient CDI spec file per prepared claim: `<driver>-claim_<claimUID>.json` in the CDI directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cdi import files
from cdi.spec import Spec
from dra_gpu.plugin.sharing.plan import CDI_CLASS


class ClaimSpecs:
    def __init__(self, cdi_dir: Path, driver: str) -> None:
        self.cdi_dir = cdi_dir
        self.driver = driver
        self._prefix = f"{driver}-{CDI_CLASS}_"

    def path(self, uid: str) -> Path:
        return self.cdi_dir / files.transient_spec_name(self.driver, CDI_CLASS, uid)

    def exists(self, uid: str) -> bool:
        return self.path(uid).is_file()

    def write(self, uid: str, spec: Spec | dict[str, Any]) -> Path:
        model = spec if isinstance(spec, Spec) else Spec.model_validate(spec)
        return files.write_spec(self.cdi_dir, model, uid)

    def remove(self, uid: str) -> bool:
        if not self.cdi_dir.is_dir():
            return False
        return files.remove_spec(self.cdi_dir, self.driver, CDI_CLASS, uid)

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
