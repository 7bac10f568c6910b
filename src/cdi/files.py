"""Reading, atomically writing and removing CDI spec files.

A runtime resolves CDI names when it creates a container, possibly while we are still writing,
so a spec file must never be seen half-written: write a temporary file whose extension the loader
ignores, fsync it, rename it over the final name, and fsync the directory so the rename survives a
crash. Per-claim ("transient") files are named like the reference library's
``GenerateTransientSpecName``: ``<vendor>-<class>_<transientID>.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cdi import names, validation
from cdi.errors import CDIError
from cdi.spec import Spec

SPEC_EXTENSIONS = (".json", ".yaml")
"""The only extensions runtimes load; anything else in a spec directory is ignored."""
TEMP_SUFFIX = ".tmp"


def transient_spec_name(vendor: str, cls: str, transient_id: str, ext: str = ".json") -> str:
    """File name of a transient spec; ``/`` in the ID becomes ``_`` as in the reference library."""
    names.validate_vendor(vendor)
    names.validate_class(cls)
    if ext not in SPEC_EXTENSIONS:
        raise CDIError(
            f"CDI spec extension {ext!r} is invalid: runtimes only load {' and '.join(SPEC_EXTENSIONS)}"
        )
    safe_id = transient_id.replace("/", "_")
    if not safe_id or "\0" in safe_id:
        raise CDIError(
            f"CDI transient ID {transient_id!r} is invalid: it must be non-empty and contain no NUL"
        )
    return f"{vendor}-{cls}_{safe_id}{ext}"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that, like the runtimes' strict YAML decoding, refuses duplicate keys."""


def _no_duplicate_keys(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in result:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        result[key] = loader.construct_object(value_node, deep=True)
    return result


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def parse_spec(text: str, fmt: str = "json", source: str = "<string>") -> Spec:
    """Parse spec text strictly (unknown keys, wrong types, duplicate keys fail); no semantic checks."""
    try:
        data = (
            json.loads(text, object_pairs_hook=_json_object)
            if fmt == "json"
            else yaml.load(text, Loader=_StrictLoader)
        )
    except (ValueError, yaml.YAMLError) as e:
        raise CDIError(f"CDI spec {source} is not valid {fmt.upper()}: {e}") from e
    if not isinstance(data, dict):
        raise CDIError(f"CDI spec {source} is not a mapping")
    try:
        return Spec.model_validate(data)
    except ValidationError as e:
        details = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors()
        )
        raise CDIError(f"CDI spec {source} does not match the CDI schema: {details}") from e


def read_spec(path: Path) -> Spec:
    """Load one spec file the way a runtime does (format from the extension)."""
    fmt = "yaml" if path.suffix == ".yaml" else "json"
    try:
        text = path.read_text()
    except OSError as e:
        raise CDIError(f"cannot read CDI spec {path}: {e.strerror or e}") from e
    return parse_spec(text, fmt, str(path))


def write_spec(directory: Path, spec: Spec, transient_id: str) -> Path:
    """Atomically write ``spec`` as the transient spec file for ``transient_id``; return its path.

    ``cdiVersion`` becomes the minimum the spec needs unless the caller set one (which must then
    be known and high enough). The spec is validated first: a runtime would silently skip an
    invalid file and fail the container later with "unresolvable CDI devices".
    """
    vendor, cls = names.parse_kind(spec.kind)
    final = directory / transient_spec_name(vendor, cls, transient_id)
    spec = spec.with_version()
    validation.validate_spec(spec)
    data = spec.to_json().encode()
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{final.name}.", suffix=TEMP_SUFFIX)
    except (FileNotFoundError, NotADirectoryError):  # made here, or failing with the directory's name
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{final.name}.", suffix=TEMP_SUFFIX)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o644)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return final


def remove_spec(directory: Path, vendor: str, cls: str, transient_id: str) -> bool:
    """Remove a transient spec (and temp files a crashed write left); False if it was not there."""
    name = transient_spec_name(vendor, cls, transient_id)
    for leftover in directory.glob(f".{_glob_escape(name)}.*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    try:
        (directory / name).unlink()
    except FileNotFoundError:
        return False
    _fsync_dir(directory)
    return True


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "SPEC_EXTENSIONS",
    "parse_spec",
    "read_spec",
    "remove_spec",
    "transient_spec_name",
    "write_spec",
]
