"""Running the check programs: every run has a timeout, and nothing it does can raise past the check."""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Ran:
    argv: list[str]
    rc: int | None
    """None when it could not start or was killed for running past its timeout."""
    stdout: str
    stderr: str
    seconds: float
    problem: str = ""
    """Why it has no exit status (not found, timed out), empty otherwise."""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def describe(self) -> list[str]:
        """The command and the tail of its output, for a result's details."""
        head = f"$ {shlex.join(self.argv)}  -> " + (self.problem or f"exit {self.rc}")
        out = [head]
        out += [f"  {line}" for line in self.stdout.strip().splitlines()[-6:]]
        out += [f"  stderr: {line}" for line in self.stderr.strip().splitlines()[-4:]]
        return out

    def why(self) -> str:
        """One line for a failure summary."""
        if self.problem:
            return self.problem
        last = (self.stderr.strip() or self.stdout.strip()).splitlines()[-1:] or ["no output"]
        return f"exit {self.rc}: {last[0][:160]}"


def run(
    argv: Sequence[str | Path],
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    stdin: str | None = None,
    cwd: Path | None = None,
) -> Ran:
    args = [str(a) for a in argv]
    started = time.monotonic()
    try:
        done = subprocess.run(
            args,
            env=dict(env) if env is not None else None,
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError:
        return Ran(args, None, "", "", 0.0, f"{args[0]} not found")
    except PermissionError as exc:
        return Ran(args, None, "", "", 0.0, f"{args[0]} cannot run: {exc}")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return Ran(args, None, out, err, timeout_s, f"timed out after {timeout_s:g}s")
    return Ran(args, done.returncode, done.stdout, done.stderr, time.monotonic() - started)


class Background:
    """A program that prints a line (`holding`, `ready`) and then waits on its stdin.

    `release()` writes a byte and closes stdin, which lets it finish; `collect()` waits for it.
    """

    def __init__(self, argv: Sequence[str | Path], env: Mapping[str, str] | None, log: Path) -> None:
        self.argv = [str(a) for a in argv]
        self.log = log
        self._out = open(log, "w+")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(
            self.argv,
            env=dict(env) if env is not None else None,
            stdin=subprocess.PIPE,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, line: str, timeout_s: float) -> bool:
        """True once `line` is printed; False when the process exits first or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if line in self.text().splitlines():
                return True
            if self.process.poll() is not None:
                return line in self.text().splitlines()
            select.select([], [], [], 0.05)
        return False

    def send(self, text: str) -> None:
        """Write to its stdin and keep it open (a step of a program that waits more than once)."""
        stdin = self.process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError, ValueError):
                stdin.write(text)
                stdin.flush()

    def release(self) -> None:
        stdin = self.process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError, ValueError):
                stdin.write("g")
                stdin.flush()
            with contextlib.suppress(OSError, ValueError):
                stdin.close()

    def collect(self, timeout_s: float) -> Ran:
        started = time.monotonic()
        self.release()
        problem = ""
        try:
            rc: int | None = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            rc, problem = None, f"timed out after {timeout_s:g}s"
        self._out.close()
        return Ran(self.argv, rc, self.text(), "", time.monotonic() - started, problem)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self._out.close()


@contextlib.contextmanager
def background(argv: Sequence[str | Path], env: Mapping[str, str] | None, log: Path) -> Iterator[Background]:
    proc = Background(argv, env, log)
    try:
        yield proc
    finally:
        proc.stop()


def which(name: str, path: str | None = None) -> str | None:
    import shutil

    return shutil.which(name, path=path or os.environ.get("PATH"))
