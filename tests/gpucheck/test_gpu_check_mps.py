"""The GPU check's MPS verdicts on what a real H100 printed (native/limiter/tests/real-gpu/h100-2026-11.json).

There, MPS worked: each client saw and used its share of the GPU's 132 SMs, and the daemon listed its
server. The check failed both clients and printed "empty" beside a server PID; these are the same
outputs, judged again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpucheck.checks.gpu_settings import MPS_CLIENTS, judge_mps_client, judge_mps_server
from gpucheck.parse import key_values
from gpucheck.proc import Ran

REPORT = Path("native/limiter/tests/real-gpu/h100-2026-11.json")
H100_SMS = 132
"""The H100 80GB HBM3's SMs, as a program outside MPS counts them."""


def recorded(name: str) -> dict[str, Any]:
    results = json.loads(REPORT.read_text())["results"]
    return next(r for r in results if r["name"] == name)


def printed(result: dict[str, Any], program_line: str) -> dict[str, str]:
    """The key=value lines one recorded command printed (its details, below its `$ ...` line)."""
    lines: list[str] = []
    inside = False
    for line in result["details"]:
        if line.startswith("$ "):
            inside = program_line in line
            continue
        if inside:
            lines.append(line.strip())
    return key_values("\n".join(lines))


@pytest.mark.parametrize(("client", "percent", "limit"), MPS_CLIENTS)
def test_a_client_that_used_its_share_of_the_gpus_sms_passes(client: str, percent: int, limit: int) -> None:
    result = recorded(f"mps.client-{client}")
    sms = printed(result, " sms ")
    fill = {"allocated": str(result["figures"]["allocated"])}
    ok = Ran(["gc_rt_shared"], 0, "", "", 0.1)
    verdict = judge_mps_client(f"mps.client-{client}", percent, limit, fill, sms, [ok], H100_SMS)
    assert verdict.status == "pass", verdict.summary
    assert f"of the GPU's {H100_SMS} SMs" in verdict.summary


def test_a_client_that_used_the_whole_gpu_fails() -> None:
    """MPS not limiting at all: a 25 % client that saw and used all 132 SMs."""
    ok = Ran(["gc_rt_shared"], 0, "", "", 0.1)
    sms = {"sms_used": str(H100_SMS), "sms": str(H100_SMS)}
    verdict = judge_mps_client(
        "mps.client-a", 25, 1 << 30, {"allocated": str(900 << 20)}, sms, [ok], H100_SMS
    )
    assert verdict.status == "fail"
    assert "132 of the GPU's 132 SMs used at 25 % active threads (expected about 33" in verdict.summary


def test_the_server_check_reports_the_pid_it_listed() -> None:
    pid = recorded("mps.server")["summary"].split(": ", 1)[1].split()[0]  # what the H100's daemon printed
    verdict = judge_mps_server(Ran(["nvidia-cuda-mps-control"], 0, f"{pid}\n", "", 0.1))
    assert verdict.status == "pass"
    assert verdict.summary == f"the daemon lists server PID {pid} while a client runs"
    assert "empty" not in verdict.summary


def test_the_server_check_fails_when_nothing_is_listed() -> None:
    verdict = judge_mps_server(Ran(["nvidia-cuda-mps-control"], 0, "\n", "", 0.1))
    assert verdict.status == "fail" and "listed no server" in verdict.summary
