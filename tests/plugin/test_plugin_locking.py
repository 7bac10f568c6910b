"""The node is the last line of defence: a GPU command that hangs holds up only its own GPU, and
prepare refuses a share that would take a GPU past its capacity, saying so on the claim and the pod."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from plugin_harness import (
    Alloc,
    Kubelet,
    PluginDirs,
    add_claim,
    gpu_config,
    opaque,
    running_plugin,
    share_claim,
    uid_of,
)
from waiting import wait_for

from dra_gpu.host.nvidia import NvidiaCommands
from dra_gpu.kube.fake import FakeKube

HANGING_SMI = """#!/bin/sh
# nvidia-smi compute-policy -i <index> --set-timeslice <value>: GPU 0 never answers.
if [ "$3" = "0" ]; then
    echo $$ > "{pid_file}"
    exec sleep 600
fi
exit 0
"""


def _written_pid(path: Path) -> int:
    """The PID the hanging command wrote; 0 until it has."""
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else 0


def test_a_hung_gpu_command_does_not_fail_a_prepare_on_another_gpu(
    dirs: PluginDirs, api: FakeKube, tmp_path: Path
) -> None:
    pid_file = tmp_path / "hung.pid"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(HANGING_SMI.format(pid_file=pid_file))
    smi.chmod(0o755)
    commands = NvidiaCommands(nvidia_smi=str(smi), timeout_s=300)
    slices = [opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Long"}))]
    stuck = add_claim(
        api, "stuck", [Alloc(device="gpu-0", share_id="00000000-0000-4000-8000-0000000000a0")], slices
    )
    other = add_claim(
        api, "other", [Alloc(device="gpu-1", share_id="00000000-0000-4000-8000-0000000000a1")], slices
    )
    first: dict[str, Any] = {}

    with running_plugin(dirs, api, commands=commands):
        hung_kubelet, kubelet = Kubelet(dirs.registration_dir), Kubelet(dirs.registration_dir)
        hung_kubelet.register()
        kubelet.register()
        thread = threading.Thread(target=lambda: first.update(hung_kubelet.prepare(stuck)))
        thread.start()
        pid = wait_for(lambda: _written_pid(pid_file), what="the hanging command to run")
        try:
            response = kubelet.prepare(other)[uid_of(other)]
            assert response.error == ""
            assert [d.device_name for d in response.devices] == ["gpu-1"]
            assert thread.is_alive(), "the claim on the hung GPU is still waiting for its command"
        finally:
            os.kill(pid, signal.SIGKILL)
            thread.join(timeout=60)
            hung_kubelet.close()
            kubelet.close()
    assert "nvidia-smi" in first[uid_of(stuck)].error


def test_prepare_refuses_a_share_that_takes_the_gpu_past_its_capacity(
    dirs: PluginDirs, api: FakeKube, kubelet: Kubelet
) -> None:
    shares = [share_claim(api, f"share-{i}", share=0xB0 + i, memory="30Gi", cores="30") for i in range(3)]
    with running_plugin(dirs, api):
        kubelet.register()
        answers = [kubelet.prepare(s)[uid_of(s)] for s in shares]
    assert answers[0].error == answers[1].error == ""
    error = answers[2].error
    assert error.startswith("ResourceClaim default/share-2: GPU gpu-0 (GPU-")
    assert (
        ") has 81408Mi of memory; the shares prepared on it take 60Gi (default/share-0 30Gi, "
        "default/share-1 30Gi) and this one asks for 30Gi, more than the GPU has" in error
    )
    assert error.endswith("delete the claim so that it is allocated again")
    events = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]): e for e in api.list("Event")[0]}
    for kind, name in (("ResourceClaim", "share-2"), ("Pod", "share-2-pod")):
        event = events[(kind, name)]
        assert (event["type"], event["reason"], event["message"]) == ("Warning", "PrepareFailed", error)
    assert ("ResourceClaim", "share-0") not in events
