#!/usr/bin/env python3
"""A stand-in for `nvidia-cuda-mps-control` (protocol 2) whose daemon is a real, long-lived process.

- `-d` forks the daemon and returns at once, as the real one does. The daemon writes its pid to
  `<pipe>/daemon.pid`, writes `daemon-<CUDA_VISIBLE_DEVICES>` into its own /dev/shm (so a test can
  tell which /dev/shm it got), creates `<pipe>/control` and then lives until told to quit.
- no argument: a control client. It reads commands from stdin and exits 1 ("Cannot find MPS
  control daemon process") when no daemon answers on the pipe directory; `quit` stops the daemon.

Every start is logged to `$FAKE_MPS_LOG` (one line: the launcher's pid and the daemon's pid).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def _pipe() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def daemon_pid(pipe: Path) -> int | None:
    """The daemon's pid if it is alive and still answers on `pipe`."""
    try:
        pid = int((pipe / "daemon.pid").read_text())
    except (OSError, ValueError):
        return None
    if not (pipe / "control").exists():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def _daemon(pipe: Path) -> None:
    os.setsid()  # as daemon(3) does
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "none")
    Path("/dev/shm", f"daemon-{gpu}").write_text(f"{os.getpid()}\n")
    (pipe / "daemon.pid").write_text(str(os.getpid()))
    (pipe / "control").write_text("socket stand-in\n")
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop and (pipe / "control").exists():
        time.sleep(0.05)
    for name in ("control", "daemon.pid"):
        (pipe / name).unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    pipe = _pipe()
    if argv[:1] == ["-d"]:
        if daemon_pid(pipe) is not None:
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        child = os.fork()
        if child == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            try:
                _daemon(pipe)
            finally:
                os._exit(0)
        deadline = time.monotonic() + 10
        while daemon_pid(pipe) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        log = os.environ.get("FAKE_MPS_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {child}\n")
        return 0
    pid = daemon_pid(pipe)
    if pid is None:
        print(f"Cannot find MPS control daemon process (pipe directory {pipe})", file=sys.stderr)
        return 1
    if "quit" in sys.stdin.read():
        (pipe / "control").unlink(missing_ok=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
