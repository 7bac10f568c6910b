"""dra-gpu update-ldcache: the OCI createContainer hook that adds folders of a container to its loader cache.

Named in claims' CDI specs when the driver's libraries are mounted without the NVIDIA Container Toolkit.
The container runtime runs it as root on the host, in the container's mount namespace before the container
starts, with the OCI state (JSON) on stdin: `update-ldcache FOLDER...`. It runs `ldconfig -r <root>
FOLDER...` (ldconfig chroots into the container's root itself), then gives a folder that holds
`libcuda.so.1` the link `libcuda.so -> libcuda.so.1` that programs linking with `-lcuda` need (the
toolkit's spec makes the same link).

The host's python3 runs this file as it is (`install_ldcache_hook` puts a `#!<python3> -I` line on
top), so it imports nothing but the standard library. The state and the bundle's `config.json` are read
with a JSON parser. A folder is a path inside the container, whose files another container of the pod
may change while the hook runs (a shared volume): it is resolved one component at a time from a
descriptor of the container's root, never following a link out of it (an absolute link starts again at
the root, `..` stops there, as `openat2(RESOLVE_IN_ROOT)` does), and the link is made with `symlinkat`
in the directory so opened, which fails if the name exists. Nothing is checked by path and then done by
path again. Bad input: one line on stderr and exit status 2.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

DEV_LINKS = {"libcuda.so": "libcuda.so.1"}
"""Development names a program links with (`-lcuda`, as Triton does) and the soname each points to."""
LDCONFIGS = ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real", "/usr/sbin/ldconfig.real")
MAX_LINKS = 40
"""As the kernel's own limit on links followed in one lookup."""
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class HookError(Exception):
    """Input the hook cannot work with: its message is the one line it prints."""


def container_root(state_text: str) -> str:
    """The container's root file system on the host, from the OCI state and its bundle's config.json."""
    try:
        state = json.loads(state_text)
    except ValueError as exc:
        raise HookError(f"the OCI state on stdin is not JSON: {exc}") from None
    bundle = state.get("bundle") if isinstance(state, dict) else None
    if not isinstance(bundle, str) or not bundle.startswith("/"):
        raise HookError("the OCI state on stdin names no absolute bundle directory")
    config_path = os.path.join(bundle, "config.json")
    try:
        with open(config_path, "rb") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise HookError(f"cannot read {config_path}: {exc}") from None
    root = config.get("root") if isinstance(config, dict) else None
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise HookError(f"no root.path in {config_path}")
    return path if path.startswith("/") else os.path.join(bundle, path)


def _parts(path: str) -> list[str]:
    """The components of `path`, last first (a stack to pop from)."""
    return [p for p in path.split("/") if p not in ("", ".")][::-1]


def open_in_root(root_fd: int, path: str) -> int:
    """A descriptor of directory `path` inside the root `root_fd`, links resolved inside that root."""
    pending = _parts(path)
    opened = [os.dup(root_fd)]  # the root, then each directory below it on the way
    links = 0
    try:
        while pending:
            name = pending.pop()
            if name == "..":
                if len(opened) > 1:
                    os.close(opened.pop())
                continue
            try:
                opened.append(os.open(name, _DIRECTORY, dir_fd=opened[-1]))
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
            target = os.readlink(name, dir_fd=opened[-1])  # EINVAL: a file, not a directory
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, "too many links", path)
            if target.startswith("/"):
                while len(opened) > 1:
                    os.close(opened.pop())
            pending.extend(_parts(target))
        return os.dup(opened[-1])
    finally:
        for fd in opened:
            os.close(fd)


def link_dev_names(directory_fd: int) -> list[str]:
    """Make each missing development link of `DEV_LINKS` whose soname is in the directory; their names."""
    made = []
    for name, soname in DEV_LINKS.items():
        try:
            os.stat(soname, dir_fd=directory_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        try:
            os.symlink(soname, name, dir_fd=directory_fd)
        except FileExistsError:
            continue
        made.append(name)
    return made


def run(folders: list[str], state_text: str) -> None:
    if not folders:
        raise HookError("name at least one folder inside the container")
    for folder in folders:
        if not folder.startswith("/"):
            raise HookError(f"{folder} is not an absolute path inside the container")
    root = container_root(state_text)
    ldconfig = next((p for p in LDCONFIGS if os.access(p, os.X_OK)), None)
    if ldconfig is None:
        raise HookError("ldconfig not found on this node")
    done = subprocess.run([ldconfig, "-r", root, *folders], check=False)
    if done.returncode != 0:
        raise HookError(f"{ldconfig} -r {root} failed with status {done.returncode}")
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise HookError(f"cannot open the container's root {root}: {exc.strerror}") from None
    try:
        for folder in folders:
            try:
                fd = open_in_root(root_fd, folder)
            except OSError:
                continue  # not there, or not a directory: nothing to link in it
            try:
                link_dev_names(fd)
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)


def main(argv: list[str]) -> int:
    try:
        run(argv[1:], sys.stdin.read())
    except HookError as exc:
        print(f"dra-gpu update-ldcache: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
