"""What a user sees when a command is given something it cannot use: one line, a distinct exit status.

Exit statuses: 0 done, 1 a check failed or something outside the command failed (NVML, the API),
2 bad input (a flag, a value, a file), 141 the reader of stdout went away (as a shell reports SIGPIPE).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dra_gpu.cli import EXIT_BROKEN_PIPE, main

CLI = [sys.executable, "-m", "dra_gpu.cli"]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DRA_GPU_")}


@pytest.fixture(autouse=True)
def no_flag_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("DRA_GPU_")]:
        monkeypatch.delenv(name)


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`dra-gpu gpus -o json | head -1`: the pipe's reader is gone before the command writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE, as after `head` has exited
    try:
        proc = subprocess.run(
            [*CLI, "gpus", "-o", "json", "--simulate", "8xH100-80GB"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=clean_env(),
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == EXIT_BROKEN_PIPE == 141
    assert proc.stderr == b""


def test_a_reader_that_stops_reading_midway_ends_the_command_quietly() -> None:
    """The real pipeline: `head -c 100` takes the start of the output and exits."""
    proc = subprocess.run(
        f"{sys.executable} -m dra_gpu.cli gpus -o json --simulate 64xH100-80GB | head -c 100 >/dev/null;"
        " echo ${PIPESTATUS[0]}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert proc.stdout.strip() in ("0", "141")  # 0 when head read it all before exiting
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr
    assert proc.stderr == ""


def test_an_empty_simulate_is_refused_not_read_as_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--simulate", ""]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: --simulate needs a profile such as 2xH100-80GB (leave it out for NVML)\n"


def test_a_sharing_entry_naming_no_gpu_of_the_node_is_refused_at_start(tmp_path: Path) -> None:
    env = clean_env()
    env.update(DRA_GPU_NODE_NAME="node-1", DRA_GPU_GPU_BACKEND="simulated:1xH100-80GB")
    for entry, named in (
        ("5=MPS", "5"),
        ("*=Shared,GPU-00000000-0000-0000-0000-000000000000=MPS", "GPU-0000"),
    ):
        proc = subprocess.run(
            [*CLI, "kubelet-plugin", "--sharing", entry, "--state-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1
        assert lines[0].startswith(f"error: --sharing {entry!r}: no GPU {named}")
        assert "its GPUs: 0 (GPU-" in lines[0]


def test_a_sharing_entry_by_index_or_uuid_of_the_node_passes_the_check() -> None:
    from dra_gpu.commands.kubelet_plugin import unknown_sharing_keys
    from dra_gpu.config import NodeSharing
    from dra_gpu.inventory import open_inventory

    inventory = open_inventory("simulated:2xH100-80GB", seed="node-1")
    gpus = inventory.gpus()
    assert unknown_sharing_keys(NodeSharing.parse(f"*=Shared,1=MPS,{gpus[0].uuid}=Exclusive"), gpus) == ""
    assert "no GPU 2 on this node" in unknown_sharing_keys(NodeSharing.parse("2=MPS"), gpus)


def test_the_values_file_backend_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("kubeletPlugin:\n  gpuBackend: simulated:3xFOO\n")
    assert main(["manifests", "--values", str(values)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(
        f"error: {values}: invalid values: kubeletPlugin.gpuBackend: bad GPU profile"
    )
    assert "unknown GPU model 'FOO'" in captured.err

    values.write_text("kubeletPlugin:\n  gpuBackend: simulated:2xH100-80GB,driver=615.71.09\n")
    assert main(["manifests", "--values", str(values)]) == 0


def test_schema_check_says_missing_for_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gpuconfig.schema.json"
    assert main(["schema", "--check", "--path", str(path)]) == 1
    assert capsys.readouterr().err == f"{path} is missing: run `dra-gpu schema --write`\n"
    path.write_text("{}\n")
    assert main(["schema", "--check", "--path", str(path)]) == 1
    assert capsys.readouterr().err == f"{path} is stale: run `dra-gpu schema --write`\n"
    assert main(["schema", "--write", "--path", str(path)]) == 0
    assert main(["schema", "--check", "--path", str(path)]) == 0
