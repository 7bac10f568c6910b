"""The image's supply chain: its Python dependencies come from requirements.lock, each pinned with the
hashes of its wheels, and that lock is exactly the dependency closure of pyproject.toml (no package
missing, none extra, every pin inside pyproject's bounds); the image runs as a non-root user unless a
pod asks for root, and carries a software bill of materials written at build by tools/sbom.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from repo_paths import ROOT

from dra_gpu.manifests import load_values, render

LOCK = ROOT / "requirements.lock"
BUILD_TOOLS = {"setuptools", "wheel", "packaging"}
"""What builds the project in the image (`pip install --no-build-isolation .`): wheel needs packaging."""


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of requirements.lock."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in LOCK.read_text().splitlines():
        line = line.strip().rstrip("\\").strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash=sha256:"):
            entries[current][1].append(line.removeprefix("--hash=sha256:"))
            continue
        name, _, version = line.partition("==")
        current = normalized(name)
        entries[current] = (version, [])
    return entries


def closure() -> dict[str, Requirement]:
    """Every distribution pyproject's dependencies need, with the requirement that named it first."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    seen: dict[str, Requirement] = {}
    todo = [Requirement(r) for r in project["dependencies"]]
    while todo:
        requirement = todo.pop()
        name = normalized(requirement.name)
        if name in seen or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen[name] = requirement
        todo.extend(Requirement(r) for r in metadata.distribution(name).requires or [])
    return seen


def test_the_lock_is_the_dependency_closure_each_pinned_with_hashes() -> None:
    lock = locked()
    needed = closure()
    assert set(lock) - BUILD_TOOLS == set(needed)
    for name, (version, hashes) in lock.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name
        if name in needed:
            assert needed[name].specifier.contains(version, prereleases=True), (name, version)
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for requirement in map(Requirement, build):
        assert requirement.specifier.contains(lock[normalized(requirement.name)][0])


def test_the_image_installs_from_the_lock_by_hash_and_runs_as_a_non_root_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes --no-deps --only-binary=:all: -r requirements.lock" in dockerfile
    assert "--no-build-isolation" in dockerfile and "pip check" in dockerfile
    final = dockerfile.rpartition("\nFROM ")[2]
    user = [line for line in final.splitlines() if line.startswith("USER ")]
    assert user == ["USER 65532:65532"]
    assert "sbom.py > /usr/share/dra-gpu/sbom.cdx.json" in final
    # the build context holds what the Dockerfile copies (everything else is ignored)
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "!requirements.lock" in ignore and "!tools/sbom.py" in ignore
    # whatever asks for root says so itself
    docs = [d for text in render(load_values()).values() for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        if doc["kind"] not in ("DaemonSet", "Deployment"):
            continue
        pod = doc["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            user_id = container.get("securityContext", {}).get(
                "runAsUser", pod.get("securityContext", {}).get("runAsUser")
            )
            assert user_id is not None, container["name"]


def test_the_sbom_lists_the_installed_python_and_debian_packages(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(
        "Package: mount\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.38.1-5+deb12u1\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n"
        "Package: python3\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3.11.2-1+b1\n"
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "sbom.py"), "--dpkg-status", str(status)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    document = json.loads(done.stdout)
    assert (document["bomFormat"], document["specVersion"]) == ("CycloneDX", "1.5")
    purls = {c["purl"] for c in document["components"]}
    assert "pkg:deb/debian/mount@2.38.1-5+deb12u1?arch=amd64" in purls
    assert not any("/gone@" in p for p in purls)
    for name in closure():
        assert f"pkg:pypi/{name}@{metadata.version(name)}" in purls
