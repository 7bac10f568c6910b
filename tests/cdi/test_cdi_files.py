"""Per-claim spec files: names, atomic writes, idempotent removal."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cdi.errors import CDIError
from cdi.files import SPEC_EXTENSIONS, read_spec, remove_spec, transient_spec_name, write_spec
from cdi.resolver import Registry
from cdi.spec import ContainerEdits, Device, DeviceNode, Mount, Spec

VENDOR, CLASS = "k8s.gpu.example.com", "claim"
UID = "0b7e5c3a-9f7d-4f4e-8a2b-1c2d3e4f5a6b"


def _spec(env: str = "GPU=0", name: str = f"{UID}-gpu-0", **edits: Any) -> Spec:
    return Spec(
        kind=f"{VENDOR}/{CLASS}",
        devices=[Device(name=name, container_edits=ContainerEdits(env=[env], **edits))],
    )


def test_transient_name_matches_the_reference_library() -> None:
    assert transient_spec_name(VENDOR, CLASS, UID) == f"k8s.gpu.example.com-claim_{UID}.json"
    assert (
        transient_spec_name(VENDOR, CLASS, "ns/pod", ext=".yaml") == "k8s.gpu.example.com-claim_ns_pod.yaml"
    )


def test_transient_name_rejects_what_a_runtime_would_ignore_or_misread() -> None:
    with pytest.raises(CDIError, match=r"extension '\.tmp' is invalid: runtimes only load \.json and \.yaml"):
        transient_spec_name(VENDOR, CLASS, UID, ext=".tmp")
    with pytest.raises(CDIError, match=r"CDI transient ID '' is invalid"):
        transient_spec_name(VENDOR, CLASS, "")
    with pytest.raises(CDIError, match=r"CDI vendor '../etc' is invalid"):
        transient_spec_name("../etc", CLASS, UID)


def test_write_then_read_gives_the_same_spec_with_the_minimum_version(tmp_path: Path) -> None:
    spec = _spec(name="gpu-0", device_nodes=[DeviceNode(path="/dev/nvidia0", host_path="/dev/nvidia0")])
    path = write_spec(tmp_path, spec, UID)
    assert path == tmp_path / f"k8s.gpu.example.com-claim_{UID}.json"
    loaded = read_spec(path)
    assert loaded.cdi_version == "0.5.0"  # hostPath on a device node
    assert loaded.model_copy(update={"cdi_version": None}) == spec
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_write_keeps_a_version_the_caller_fixed(tmp_path: Path) -> None:
    path = write_spec(tmp_path, _spec().model_copy(update={"cdi_version": "0.8.0"}), UID)
    assert json.loads(path.read_text())["cdiVersion"] == "0.8.0"


def test_write_refuses_a_fixed_version_below_the_features_used(tmp_path: Path) -> None:
    spec = _spec(mounts=[Mount(host_path="/a", container_path="/a", type="bind")])
    with pytest.raises(CDIError) as err:
        write_spec(tmp_path, spec.model_copy(update={"cdi_version": "0.3.0"}), UID)
    # A claim UID may start with a digit, which alone needs 0.5.0; both reasons are named.
    assert "cdiVersion 0.3.0 is too low for the features used, which need 0.5.0" in str(err.value)
    assert "a name that does not start with a letter" in str(err.value)
    assert "mounts[].type" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_write_refuses_an_invalid_spec_instead_of_leaving_it_for_the_runtime(tmp_path: Path) -> None:
    bad = Spec(
        kind=f"{VENDOR}/{CLASS}", devices=[Device(name="a/b", container_edits=ContainerEdits(env=["X"]))]
    )
    with pytest.raises(CDIError) as err:
        write_spec(tmp_path, bad, UID)
    assert "CDI device name 'a/b' is invalid" in str(err.value)
    assert "env entry 'X' is not NAME=VALUE" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_write_creates_the_directory(tmp_path: Path) -> None:
    path = write_spec(tmp_path / "var" / "run" / "cdi", _spec(), UID)
    assert path.is_file()


def test_temp_file_is_invisible_to_the_loader_until_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(tmp_path, _spec("GPU=old"), UID)
    real_replace = os.replace
    seen: dict[str, object] = {}

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        # The new content is complete in the temp file, which sits next to the final name.
        src_path = Path(src)
        seen["suffix"] = src_path.suffix
        seen["same_dir"] = src_path.parent == Path(dst).parent
        seen["content"] = json.loads(src_path.read_text())["devices"][0]["containerEdits"]["env"]
        registry = Registry.load([tmp_path])
        seen["env_during_write"] = registry.resolve([f"{VENDOR}/{CLASS}={UID}-gpu-0"]).env
        seen["skipped"] = dict(registry.skipped)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    write_spec(tmp_path, _spec("GPU=new"), UID)
    assert seen["suffix"] not in SPEC_EXTENSIONS
    assert seen["same_dir"] is True
    assert seen["content"] == ["GPU=new"]
    assert seen["env_during_write"] == {"GPU": "old"}
    assert seen["skipped"] == {}
    assert [p.name for p in tmp_path.iterdir()] == [f"k8s.gpu.example.com-claim_{UID}.json"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failed_write_leaves_the_old_file_whole_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    old = write_spec(tmp_path, _spec("GPU=old"), UID)
    before = old.read_text()

    def boom(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        write_spec(tmp_path, _spec("GPU=new"), UID)
    assert old.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == [old.name]


def test_remove_is_idempotent(tmp_path: Path) -> None:
    path = write_spec(tmp_path, _spec(), UID)
    other = write_spec(tmp_path, _spec(), "other-claim")
    assert remove_spec(tmp_path, VENDOR, CLASS, UID) is True
    assert not path.exists()
    assert remove_spec(tmp_path, VENDOR, CLASS, UID) is False
    assert other.exists()


def test_remove_also_clears_temp_files_of_a_crashed_write(tmp_path: Path) -> None:
    name = transient_spec_name(VENDOR, CLASS, UID)
    leftover = tmp_path / f".{name}.abc123.tmp"
    leftover.write_text("{")
    unrelated = tmp_path / f".{transient_spec_name(VENDOR, CLASS, 'other')}.x.tmp"
    unrelated.write_text("{")
    assert remove_spec(tmp_path, VENDOR, CLASS, UID) is False
    assert not leftover.exists()
    assert unrelated.exists()


def test_remove_in_a_missing_directory_is_a_no_op(tmp_path: Path) -> None:
    assert remove_spec(tmp_path / "absent", VENDOR, CLASS, UID) is False


def test_read_spec_reports_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(CDIError, match=r"cannot read CDI spec .*missing\.json"):
        read_spec(tmp_path / "missing.json")
