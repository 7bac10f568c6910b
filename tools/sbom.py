"""The image's software bill of materials: a CycloneDX 1.5 JSON document on stdout.

Run at image build by the image's own Python (Dockerfile, final stage), so it lists what is installed,
not what was asked for: every Python distribution this interpreter sees (`importlib.metadata`, the
project's virtual environment) and every Debian package the dpkg database says is installed. Standard
library only. `--dpkg-status FILE` reads another dpkg database (tests).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import uuid
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

DPKG_STATUS = Path("/var/lib/dpkg/status")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python_components() -> list[dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for dist in metadata.distributions():
        name = _normalized((dist.metadata.get_all("Name") or [""])[0])
        if not name or name in found:
            continue
        component: dict[str, Any] = {
            "type": "library",
            "name": name,
            "version": dist.version,
            "purl": f"pkg:pypi/{name}@{dist.version}",
        }
        license_text = (
            dist.metadata.get_all("License-Expression") or dist.metadata.get_all("License") or [""]
        )[0]
        if license_text and "\n" not in license_text and len(license_text) < 100:
            component["licenses"] = [{"expression": license_text}]
        found[name] = component
    return [found[n] for n in sorted(found)]


def debian_components(status: Path) -> list[dict[str, Any]]:
    """Installed packages of a dpkg status database (paragraphs of `Field: value` lines)."""
    try:
        text = status.read_text(errors="replace")
    except OSError:
        return []
    components = []
    for paragraph in text.split("\n\n"):
        fields = {}
        for line in paragraph.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.startswith((" ", "\t")):
                fields[key] = value.strip()
        if "Package" not in fields or not fields.get("Status", "").endswith(" installed"):
            continue
        name, version, arch = fields["Package"], fields.get("Version", ""), fields.get("Architecture", "")
        components.append(
            {
                "type": "application" if fields.get("Section") != "libs" else "library",
                "name": name,
                "version": version,
                "purl": f"pkg:deb/debian/{name}@{version}?arch={arch}",
            }
        )
    return sorted(components, key=lambda c: str(c["name"]))


def sbom(status: Path) -> dict[str, Any]:
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "component": {"type": "container", "name": "dra-gpu"},
            "tools": {"components": [{"type": "application", "name": "dra-gpu tools/sbom.py"}]},
        },
        "components": [*python_components(), *debian_components(status)],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dpkg-status", type=Path, default=DPKG_STATUS, help="the dpkg status database")
    args = parser.parse_args(argv)
    json.dump(sbom(args.dpkg_status), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
