"""What every workload script shares: its `key=value` lines and the PyTorch it needs.

The scripts run by their path (`python gpucheck/workloads/views.py ...`), so they import this module
by its name, from the folder they are in (mypy, which reads them as `gpucheck.workloads`, is told so).
"""

from __future__ import annotations

from typing import Any


def say(line: str) -> None:
    """One line of the output the check reads, at once (the check waits for some of them)."""
    print(line, flush=True)


def first_line(exc: BaseException) -> str:
    """An exception as the check shows it: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def torch_or_skip() -> Any:
    """PyTorch with a GPU to use; None, once `skip=<reason>` is said, where there is none."""
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        say(f"skip=PyTorch is not importable ({exc})")
        return None
    if not torch.cuda.is_available():
        say("skip=torch.cuda.is_available() is False")
        return None
    return torch
