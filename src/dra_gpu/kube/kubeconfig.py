"""Where the Kubernetes client's configuration comes from, in the order kubectl looks.

1. the file given explicitly (`--kubeconfig`, or the command's `DRA_GPU_KUBECONFIG`);
2. `KUBECONFIG`: a list of files (`:`-separated), merged; a missing file is skipped, and for each
   cluster, user and context, and for `current-context`, the first file that sets it wins;
3. `~/.kube/config`;
4. the in-cluster service account (a pod: `KUBERNETES_SERVICE_HOST` and the mounted token).

A file that is found is used or fails: a broken kubeconfig is never silently passed over for the next
source. When nothing is found, the error names every place that was tried.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KUBECONFIG_ENV = "KUBECONFIG"
DEFAULT_PATH = "~/.kube/config"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

_NAMED = ("clusters", "users", "contexts")
# Keys naming files, relative to the kubeconfig that holds them (kubectl's ResolvePaths).
_PATH_KEYS = {
    "clusters": ("certificate-authority",),
    "users": ("client-certificate", "client-key", "tokenFile"),
}


_PREFIX = "cannot configure the Kubernetes client"


class KubeConfigError(Exception):
    """The client cannot be configured; the message is one line naming what was tried."""


@dataclass
class Choice:
    """The configuration found: a merged kubeconfig (`config`), or None for in-cluster."""

    source: str
    config: dict[str, Any] | None = None
    tried: list[str] = field(default_factory=list)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeConfigError(f"{_PREFIX} from {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise KubeConfigError(f"{_PREFIX} from {path}: not valid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise KubeConfigError(f"{_PREFIX} from {path}: not a kubeconfig (not a mapping)")
    resolved = dict(data)
    for section, keys in _PATH_KEYS.items():
        entries = []
        for entry in resolved.get(section) or []:
            if isinstance(entry, Mapping) and isinstance(entry.get(section[:-1]), Mapping):
                inner = dict(entry[section[:-1]])
                for key in keys:
                    value = inner.get(key)
                    if isinstance(value, str) and value and not os.path.isabs(value):
                        inner[key] = str(path.parent.resolve() / value)
                entry = {**entry, section[:-1]: inner}
            entries.append(entry)
        if section in resolved:
            resolved[section] = entries
    return resolved


def merge(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge kubeconfigs as KUBECONFIG's list does: the first file to set an entry wins."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    for section in _NAMED:
        merged[section] = []
    seen: dict[str, set[str]] = {section: set() for section in _NAMED}
    for config in configs:
        if not merged.get("current-context") and config.get("current-context"):
            merged["current-context"] = config["current-context"]
        for section in _NAMED:
            for entry in config.get(section) or []:
                name = entry.get("name") if isinstance(entry, Mapping) else None
                if isinstance(name, str) and name not in seen[section]:
                    seen[section].add(name)
                    merged[section].append(entry)
        for key, value in config.items():
            if key not in merged and key not in _NAMED:
                merged[key] = value
    return merged


def _empty(config: Mapping[str, Any]) -> bool:
    return not any(config.get(section) for section in _NAMED)


def choose(
    explicit: str | None = None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> Choice:
    """The configuration to use, by kubectl's precedence; KubeConfigError naming what was tried."""
    env = os.environ if environ is None else environ
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise KubeConfigError(f"{_PREFIX} from --kubeconfig {explicit}: no such file")
        return Choice(f"--kubeconfig {explicit}", _read(path))
    tried = []
    listed = env.get(KUBECONFIG_ENV, "")
    if listed:
        paths = [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
        found = [p for p in paths if p.is_file()]
        configs = [_read(p) for p in found]
        if configs and not _empty(merged := merge(configs)):
            return Choice(f"{KUBECONFIG_ENV}={listed}", merged)
        tried.append(f"{KUBECONFIG_ENV}={listed} ({'empty' if found else 'no such file'})")
    else:
        default = (home / ".kube" / "config") if home is not None else Path(DEFAULT_PATH).expanduser()
        if default.is_file():
            config = _read(default)
            if not _empty(config):
                return Choice(str(default), merge([config]))
            tried.append(f"{default} (empty)")
        else:
            tried.append(f"{default} (no such file)")
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if host and port:
        if (service_account_dir / "token").is_file():
            return Choice("the in-cluster service account", None, tried)
        tried.append(f"in-cluster (no service account token in {service_account_dir})")
    else:
        tried.append("in-cluster (KUBERNETES_SERVICE_HOST is not set: not in a pod)")
    raise KubeConfigError(
        f"{_PREFIX}: no configuration found; tried "
        + ", ".join(tried)
        + ": pass --kubeconfig or set KUBECONFIG"
    )


def load_api_client(explicit: str | None = None) -> Any:
    """A `kubernetes.client.ApiClient` configured from the first source `choose` finds."""
    from kubernetes import client, config

    choice = choose(explicit)
    configuration = client.Configuration()
    try:
        if choice.config is None:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
                choice.config, client_configuration=configuration
            )
    except Exception as exc:  # the kubernetes client raises several unrelated types here
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise KubeConfigError(f"{_PREFIX} from {choice.source}: {reason}") from exc
    return client.ApiClient(configuration)
