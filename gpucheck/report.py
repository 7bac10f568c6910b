"""Check results, the JSON report and the printed summary, and the exit status they give.

A check returns `Result`s: pass, fail, skip (with the reason), or known (a limit the limiter
documents, observed as documented; it does not fail the run). The run fails when any result fails.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PASS = "pass"
FAIL = "fail"
SKIP = "skip"
KNOWN = "known"
STATUSES = (PASS, FAIL, SKIP, KNOWN)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_GPU = 77
"""The automake convention for "this test cannot run here"."""

REPORT_VERSION = 1


@dataclass
class Result:
    name: str
    status: str
    summary: str = ""
    """One line: the figures that matter, or why it failed or was skipped."""
    figures: dict[str, Any] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    """What was run and the tail of what it printed, for reading a failure."""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {', '.join(STATUSES)}")


def passed(name: str, summary: str, **figures: Any) -> Result:
    return Result(name, PASS, summary, figures)


def failed(name: str, summary: str, **figures: Any) -> Result:
    return Result(name, FAIL, summary, figures)


def skipped(name: str, reason: str, **figures: Any) -> Result:
    return Result(name, SKIP, reason, figures)


def verdict(name: str, ok: bool, summary: str, **figures: Any) -> Result:
    return Result(name, PASS if ok else FAIL, summary, figures)


def judged(name: str, problems: list[str], summary: Callable[[], str], **figures: Any) -> Result:
    """Failed with every one of `problems`, or passed with `summary()` (only asked for when nothing failed,
    so that it may read figures a failure could lack)."""
    if problems:
        return failed(name, "; ".join(problems), **figures)
    return Result(name, PASS, summary(), figures)


def counts(results: list[Result]) -> dict[str, int]:
    return {status: sum(1 for r in results if r.status == status) for status in STATUSES}


def exit_status(results: list[Result]) -> int:
    return EXIT_FAILED if any(r.status == FAIL for r in results) else EXIT_OK


@dataclass
class Report:
    gpu: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    finished: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "seconds": round((self.finished or time.time()) - self.started, 1),
            "host": platform.node(),
            "gpu": self.gpu,
            "environment": self.environment,
            "build": self.build,
            "counts": counts(self.results),
            "exit_status": exit_status(self.results),
            "results": [asdict(r) for r in self.results],
        }

    def write(self, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "report.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n")
        tmp.replace(path)
        return path


def load_results(data: dict[str, Any]) -> list[Result]:
    """The results of a report written by `Report.write` (for re-reading and tests)."""
    return [Result(**entry) for entry in data["results"]]


def render_summary(results: list[Result], width: int = 160) -> str:
    """One line per result, failures again at the end with their details, then the counts."""
    name_width = max([len(r.name) for r in results] + [10])
    lines = []
    for r in results:
        text = f"{r.status.upper():<5} {r.name:<{name_width}}  {r.summary}"
        lines.append(text if len(text) <= width else text[: width - 3] + "...")
    failures = [r for r in results if r.status == FAIL]
    if failures:
        lines.append("")
        lines.append("Failures:")
        for r in failures:
            lines.append(f"  {r.name}: {r.summary}")
            lines.extend(f"    {d}" for d in r.details[-6:])
    c = counts(results)
    lines.append("")
    lines.append(
        f"{c[PASS]} passed, {c[FAIL]} failed, {c[SKIP]} skipped, {c[KNOWN]} known limits "
        f"({len(results)} checks)"
    )
    return "\n".join(lines)
