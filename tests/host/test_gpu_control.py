"""The GPU command interface: the real implementation runs real processes (here stand-in executables
for nvidia-smi and nvidia-cuda-mps-control, which cannot run without a GPU), and the simulated one
keeps the GPU state a real one would leave."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import sys
from pathlib import Path

import pytest

from dra_gpu.host.gpu_commands import CommandError, ComputeMode
from dra_gpu.host.nvidia import NvidiaCommands
from dra_gpu.host.simulated import SimulatedCommands

FAKE_TOOL = """\
#!{python}
# Stand-in for {name}: logs argv, stdin and the MPS environment; behaves like the tool where it matters.
import json, os, sys, time
log = {log!r}
stdin = "" if sys.stdin.isatty() else sys.stdin.read()
entry = {{"argv": sys.argv[1:], "stdin": stdin,
         "env": {{k: v for k, v in os.environ.items() if k.startswith("CUDA_")}}}}
with open(log, "a") as f:
    f.write(json.dumps(entry) + "\\n")
mode = open({control!r}).read().strip() if os.path.exists({control!r}) else "ok"
if mode == "fail":
    sys.stderr.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\\n")
    sys.exit(9)
if mode == "hang":
    time.sleep(30)
if {name!r} == "nvidia-cuda-mps-control":
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    marker = os.path.join(pipe, "daemon-running")
    if sys.argv[1:] == ["-d"]:
        # Like a daemon that keeps the fds it was started with: it inherits our stdout and stderr.
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(os.path.join(pipe, "daemon.pid"), "w").write(str(child.pid))
        print("starting the daemon", flush=True)
        if mode != "mute":
            open(marker, "w").close()
    elif "quit" in stdin:
        os.remove(marker)
    elif not os.path.exists(marker):
        sys.stderr.write("Cannot find MPS control daemon process\\n")
        sys.exit(1)
"""


def fake_tools(tmp_path: Path) -> tuple[NvidiaCommands, Path, Path]:
    log, control = tmp_path / "calls.jsonl", tmp_path / "mode"
    paths = []
    for name in ("nvidia-smi", "nvidia-cuda-mps-control"):
        path = tmp_path / name
        path.write_text(
            FAKE_TOOL.format(python=sys.executable, name=name, log=str(log), control=str(control))
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        paths.append(str(path))
    return (
        NvidiaCommands(nvidia_smi=paths[0], mps_control=paths[1], timeout_s=5, start_wait_s=0.5),
        log,
        control,
    )


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_nvidia_smi_command_lines(tmp_path: Path) -> None:
    commands, log, _ = fake_tools(tmp_path)
    commands.set_timeslice(1, 3)
    commands.set_compute_mode("GPU-abc", ComputeMode.EXCLUSIVE_PROCESS)
    commands.set_compute_mode("GPU-abc", ComputeMode.DEFAULT)
    assert [c["argv"] for c in calls(log)] == [
        ["compute-policy", "-i", "1", "--set-timeslice", "3"],
        ["-i", "GPU-abc", "-c", "EXCLUSIVE_PROCESS"],
        ["-i", "GPU-abc", "-c", "DEFAULT"],
    ]


def test_a_failing_command_names_itself_and_its_output(tmp_path: Path) -> None:
    commands, _, control = fake_tools(tmp_path)
    control.write_text("fail")
    with pytest.raises(CommandError) as failed:
        commands.set_timeslice(0, 2)
    assert str(failed.value) == (
        f"`{commands.nvidia_smi} compute-policy -i 0 --set-timeslice 2` failed with exit code 9: "
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
    )


def test_a_hanging_command_times_out(tmp_path: Path) -> None:
    commands, _, control = fake_tools(tmp_path)
    control.write_text("hang")
    commands.timeout_s = 0.5
    with pytest.raises(CommandError, match=r"did not finish within 0.5s"):
        commands.set_compute_mode("GPU-abc", ComputeMode.DEFAULT)


def test_a_missing_tool_says_where_it_should_come_from(tmp_path: Path) -> None:
    commands = NvidiaCommands(nvidia_smi=str(tmp_path / "nowhere" / "nvidia-smi"))
    with pytest.raises(
        CommandError, match="was not found: the NVIDIA driver's tools must be on the plugin's PATH"
    ):
        commands.set_timeslice(0, 0)


def kill_daemon(pipe: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        os.kill(int((pipe / "daemon.pid").read_text()), signal.SIGKILL)


def test_mps_daemon_start_query_and_stop(tmp_path: Path) -> None:
    commands, log, _ = fake_tools(tmp_path)
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    pipe.mkdir()
    logs.mkdir()
    assert not commands.mps_daemon_running("GPU-abc", pipe)
    try:
        commands.start_mps_daemon("GPU-abc", pipe, logs)  # returns although the daemon holds its stdout
    finally:
        kill_daemon(pipe)
    assert (logs / "control-start.out").read_text() == "starting the daemon\n"
    assert commands.mps_daemon_running("GPU-abc", pipe)
    start = next(c for c in calls(log) if c["argv"] == ["-d"])
    assert start["env"] == {
        "CUDA_VISIBLE_DEVICES": "GPU-abc",
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
    }
    commands.stop_mps_daemon("GPU-abc", pipe)
    assert "quit" in calls(log)[-1]["stdin"]
    assert not commands.mps_daemon_running("GPU-abc", pipe)
    before = len(calls(log))
    commands.stop_mps_daemon("GPU-abc", pipe)  # nothing running: only a query, no quit
    assert all("quit" not in c["stdin"] for c in calls(log)[before:])


def test_a_daemon_that_never_answers_is_a_start_failure(tmp_path: Path) -> None:
    commands, _, control = fake_tools(tmp_path)
    control.write_text("mute")
    (tmp_path / "pipe").mkdir()
    (tmp_path / "log").mkdir()
    try:
        with pytest.raises(CommandError, match="started but does not answer on"):
            commands.start_mps_daemon("GPU-abc", tmp_path / "pipe", tmp_path / "log")
    finally:
        kill_daemon(tmp_path / "pipe")


def test_simulated_commands_keep_state_across_instances_and_fail_on_demand(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    first = SimulatedCommands(state_file=state)
    first.set_timeslice(1, 2)
    first.set_compute_mode("GPU-a", ComputeMode.EXCLUSIVE_PROCESS)
    first.start_mps_daemon("GPU-a", tmp_path / "pipe", tmp_path / "log")
    second = SimulatedCommands(state_file=state, fail={"set_timeslice": "Insufficient Permissions"})
    assert second.snapshot() == {
        "computeMode": {"GPU-a": "EXCLUSIVE_PROCESS"},
        "timeslice": {"1": 2},
        "mps": {"GPU-a": str(tmp_path / "pipe")},
    }
    assert second.mps_daemon_running("GPU-a", tmp_path / "pipe")
    with pytest.raises(CommandError, match="Insufficient Permissions"):
        second.set_timeslice(1, 0)
    assert second.calls == [("set_timeslice", "1", "0")]
    second.kill_mps_daemon("GPU-a")
    assert not first.mps_daemon_running("GPU-a", tmp_path / "pipe")
    first.set_timeslice(1, 0)
    first.set_compute_mode("GPU-a", ComputeMode.DEFAULT)
    assert first.snapshot() == {"computeMode": {}, "timeslice": {}, "mps": {}}
    with pytest.raises(CommandError, match="invalid time-slice value 7"):
        first.set_timeslice(0, 7)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and util-linux unshare to give the daemon its own /dev/shm",
)
def test_mps_daemon_gets_the_gpus_shm_directory_as_its_dev_shm(tmp_path: Path) -> None:
    """MPS clients mount `<mps dir>/shm` as /dev/shm; the daemon must write to the same place, a tmpfs."""
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-d" ]; then echo from-daemon > /dev/shm/marker; touch "$CUDA_MPS_PIPE_DIRECTORY/up"; exit 0; fi\n'
        '[ -e "$CUDA_MPS_PIPE_DIRECTORY/up" ]\n'
    )
    control.chmod(0o755)
    base = tmp_path / "mps"
    pipe, logs, shm = base / "pipe", base / "log", base / "shm"
    for directory in (pipe, logs, shm):
        directory.mkdir(parents=True)
    commands = NvidiaCommands(
        mps_control=str(control), timeout_s=5, start_wait_s=2, isolate_shm=True, mps_shm_bytes=64 << 20
    )
    commands.start_mps_daemon("GPU-abc", pipe, logs)
    try:
        assert (shm / "marker").read_text() == "from-daemon\n"
        assert not Path("/dev/shm/marker").exists()  # the node's own /dev/shm is untouched
        # Memory, not the node's disk, and bounded: a tmpfs of the configured size.
        usage = os.statvfs(shm)
        assert usage.f_blocks * usage.f_frsize == 64 << 20
        assert os.path.ismount(shm)
    finally:
        commands.stop_mps_daemon("GPU-abc", pipe)
    assert not os.path.ismount(shm), "the daemon's /dev/shm goes with it"
