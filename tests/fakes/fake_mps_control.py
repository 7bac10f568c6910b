#!/usr/bin/env python3
"""A stand-in for `nvidia-cuda-mps-control` with the MPS v3 interface, and the client side of routing.

Follows NVIDIA's MPS v3 documents (protocol 3 selected with `-p 3` or CUDA_MPS_PROTOCOL_VERSION;
"module verb" commands; named servers with allowed devices; namespaces with
active_thread_percentage, pinned_memory_limit and client_priority; routing by socket under the
pipe directory: `<pipe>/control` is the daemon, `<pipe>/<server>/control` the server's default
namespace, `<pipe>/<server>/<namespace>/control` a namespace). The exact verb spelling
(`server create NAME --allowed-devices UUID`, `namespace create|delete|list|set|get`) is this
project's reading; it lives in one place on each side. The daemon keeps its state in
`<pipe>/.fake-mps-state.json` instead of a process; sockets are marker files naming their target.

`client_connect` is what a CUDA client does at cuInit: connect to `$CUDA_MPS_PIPE_DIRECTORY/control`;
with no socket there it runs without MPS, which exclusive-process compute mode refuses.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

STATE = ".fake-mps-state.json"
NAMESPACE_KEYS = ("active_thread_percentage", "pinned_memory_limit", "client_priority")


class ClientRefused(Exception):
    pass


def _pipe() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def _load(pipe: Path) -> dict[str, Any] | None:
    path = pipe / STATE
    return json.loads(path.read_text()) if path.exists() else None


def _save(pipe: Path, state: dict[str, Any]) -> None:
    (pipe / STATE).write_text(json.dumps(state))


def _socket(path: Path, target: dict[str, str]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "control").write_text(json.dumps(target))


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    pipe = _pipe()
    if argv and argv[0] == "-d":
        if _load(pipe) is not None:
            return _fail("An instance of this daemon is already running")
        rest = argv[1:]
        protocol = os.environ.get("CUDA_MPS_PROTOCOL_VERSION") or (rest[1] if rest[:1] == ["-p"] else "2")
        pipe.mkdir(parents=True, exist_ok=True)
        _save(pipe, {"protocol": protocol, "servers": {}})
        _socket(pipe, {"kind": "daemon"})
        return 0
    state = _load(pipe)
    if state is None:
        return _fail(f"Cannot find MPS control daemon process (pipe directory {pipe})")
    if argv == ["-q"] or argv == ["quit"]:
        for child in sorted(pipe.rglob("*"), reverse=True):
            child.unlink() if child.is_file() else child.rmdir()
        return 0
    if state["protocol"] != "3":
        return _fail("unknown command (module verb commands need protocol 3)")
    servers: dict[str, Any] = state["servers"]
    match argv:
        case ["server", "list"]:
            print("\n".join(servers))
        case ["server", "create", name, "--allowed-devices", devices]:
            if name in servers:
                return _fail(f"server {name} already exists")
            servers[name] = {"allowed_devices": devices, "namespaces": {"default": {}}}
            _socket(pipe / name, {"kind": "server", "server": name})
            _socket(pipe / name / "default", {"kind": "namespace", "server": name, "namespace": "default"})
        case ["namespace", "list", server] if server in servers:
            print("\n".join(n for n in servers[server]["namespaces"] if n != "default"))
        case ["namespace", "create", server, name] if server in servers:
            if name in servers[server]["namespaces"]:
                return _fail(f"namespace {name} already exists on server {server}")
            servers[server]["namespaces"][name] = {}
            _socket(pipe / server / name, {"kind": "namespace", "server": server, "namespace": name})
        case ["namespace", "delete", server, name] if (
            server in servers and name in servers[server]["namespaces"]
        ):
            if name == "default":
                return _fail("the default namespace cannot be deleted")
            del servers[server]["namespaces"][name]
            for child in sorted((pipe / server / name).rglob("*"), reverse=True):
                child.unlink()
            (pipe / server / name).rmdir()
        case ["namespace", "set", server, name, key, value] if (
            server in servers and name in servers[server]["namespaces"]
        ):
            if key not in NAMESPACE_KEYS:
                return _fail(f"unknown namespace setting {key}; known: {', '.join(NAMESPACE_KEYS)}")
            if key == "active_thread_percentage" and not (value.isdigit() and 1 <= int(value) <= 100):
                return _fail(f"active_thread_percentage must be 1-100, got {value}")
            servers[server]["namespaces"][name][key] = value
        case ["namespace", "get", server, name, key] if (
            server in servers and name in servers[server]["namespaces"]
        ):
            print(servers[server]["namespaces"][name].get(key, ""))
        case _:
            return _fail(f"invalid command or unknown server/namespace: {' '.join(argv)}")
    _save(pipe, state)
    return 0


def client_connect(pipe_dir: Path, daemon_pipe: Path, exclusive_process: bool) -> dict[str, str]:
    """A CUDA client with CUDA_MPS_PIPE_DIRECTORY=`pipe_dir` (as the container sees it, mapped to the
    host directory) against the daemon at `daemon_pipe`: the namespace and limits it runs under."""
    control = pipe_dir / "control"
    if not control.exists():
        if exclusive_process:
            raise ClientRefused(
                "all CUDA-capable devices are busy or unavailable (exclusive-process, no MPS)"
            )
        return {"mps": "no"}  # the silent failure the anchors warn about, where the GPU is not exclusive
    target = json.loads(control.read_text())
    state = _load(daemon_pipe) or {"servers": {}}
    if target["kind"] == "daemon":
        server = next(iter(state["servers"]), None)
        namespace = "default"
    elif target["kind"] == "server":
        server, namespace = target["server"], "default"
    else:
        server, namespace = target["server"], target["namespace"]
    limits = state["servers"].get(server, {}).get("namespaces", {}).get(namespace)
    if limits is None:
        raise ClientRefused(f"namespace {namespace} no longer exists")
    return {"mps": "yes", "server": str(server), "namespace": namespace, **limits}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
