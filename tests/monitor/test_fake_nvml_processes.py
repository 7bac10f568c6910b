"""The fake NVML answers the per-process calls from what the fake driver's processes really hold, as nvml.h
documents them (both the C library and the Python bindings' stand-in), so the real monitor holds a real
process that bypasses the limiter to its claim's cap while a real process under the limiter is left alone."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import fake_pynvml
from limiter_env import limiter_env
from monitor_harness import add_pod, fake_proc, plugin_with_nvml
from plugin_harness import Alloc, Kubelet, PluginDirs, add_claim, monitor_of, opaque, uid_of
from test_monitor import _events, limiter_config
from waiting import wait_for

from dra_gpu.kube.fake import FakeKube

MiB = 2**20
GiB = 2**30
CONTEXT = 548995072  # FAKE_CUDA_CTX_BYTES's default: what a context took on an H100
UUID = "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000"  # the fake's device 0 when nothing names another
INSUFFICIENT_SIZE, NOT_FOUND = 7, 6


def _holder(
    built: Path, procs: Path, chunk: int, *, limiter: bool, uuid: str = UUID, **env: str
) -> subprocess.Popen[str]:
    """`limiter-probe alloc chunk 1 --hold` against the fake driver, under the limiter or without it."""
    settings = limiter_env(built, FAKE_CUDA_PROCESS_DIR=str(procs), CUDA_VISIBLE_DEVICES=uuid, **env)
    if not limiter:
        del settings["LD_PRELOAD"]
    child = subprocess.Popen(
        [str(built / "limiter-probe"), "alloc", str(chunk), "1", "--hold"],
        env=settings,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines = [child.stdout.readline().strip() for _ in range(3)]
    assert lines[-1] == "holding", lines
    return child


@pytest.fixture
def procs(tmp_path: Path) -> Path:
    path = tmp_path / "driver-processes"
    path.mkdir()
    return path


@pytest.fixture
def c_nvml(built: Path, procs: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    monkeypatch.setenv("FAKE_CUDA_PROCESS_DIR", str(procs))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", UUID)
    lib = ctypes.CDLL(str(built / "fake" / "libnvidia-ml.so.1"))
    assert lib.nvmlInit_v2() == 0
    yield lib
    lib.nvmlShutdown()


class ProcessInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class UtilizationSample(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


def test_the_c_fake_lists_what_each_process_holds_with_nvml_return_codes(
    built: Path, procs: Path, c_nvml: ctypes.CDLL
) -> None:
    handle = ctypes.c_void_p()
    assert c_nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
    count = ctypes.c_uint(0)
    assert c_nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None) == 0
    assert count.value == 0, "no process holds the GPU: success, none"
    a = _holder(built, procs, GiB, limiter=False)
    b = _holder(built, procs, 512 * MiB, limiter=False)
    try:

        def listed() -> dict[int, int]:
            count = ctypes.c_uint(0)
            if (
                c_nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None)
                != INSUFFICIENT_SIZE
            ):
                return {}
            infos = (ProcessInfo * count.value)()
            assert c_nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos) == 0
            return {i.pid: i.usedGpuMemory for i in infos[: count.value]}

        assert wait_for(lambda: len(listed()) == 2, what="both processes listed")
        assert listed() == {a.pid: GiB + CONTEXT, b.pid: 512 * MiB + CONTEXT}
        one = ctypes.c_uint(1)
        infos = (ProcessInfo * 1)()
        assert (
            c_nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(one), infos)
            == INSUFFICIENT_SIZE
        )
        assert one.value == 2, "the count needed"
        # Utilization: none yet, then one sample per process per publication; none newer than the last seen.
        samples = ctypes.c_uint(0)
        wait_for(
            lambda: (
                c_nvml.nvmlDeviceGetProcessUtilization(handle, None, ctypes.byref(samples), 0)
                == INSUFFICIENT_SIZE
            ),
            what="utilization samples",
        )
        buffer = (UtilizationSample * samples.value)()
        assert c_nvml.nvmlDeviceGetProcessUtilization(handle, buffer, ctypes.byref(samples), 0) == 0
        got = buffer[: samples.value]
        assert {s.pid for s in got} <= {a.pid, b.pid} and all(s.smUtil == 0 for s in got), (
            "they run no kernels"
        )
        newest = max(s.timeStamp for s in got)
        # Nothing at or before the last seen comes again: NOT_FOUND, or only what a process published since.
        samples.value = len(buffer)
        again = c_nvml.nvmlDeviceGetProcessUtilization(
            handle, buffer, ctypes.byref(samples), ctypes.c_ulonglong(newest)
        )
        assert again == NOT_FOUND or (
            again == 0 and all(s.timeStamp > newest for s in buffer[: samples.value])
        ), "a sample no newer than lastSeenTimeStamp was returned"
        a.kill()
        a.wait()
        assert wait_for(lambda: list(listed()) == [b.pid], what="the exited process gone")
    finally:
        for child in (a, b):
            child.kill()
            child.wait()


def test_the_python_fake_lists_the_same_processes(built: Path, procs: Path) -> None:
    driver = fake_pynvml.FakeDriver(gpus=[fake_pynvml.FakeGpu(uuid=UUID)], process_dir=str(procs))
    fake_pynvml.install(driver)
    holder = _holder(built, procs, GiB, limiter=False)
    try:
        fake_pynvml.nvmlInit()
        handle = fake_pynvml.nvmlDeviceGetHandleByIndex(0)
        running = wait_for(
            lambda: fake_pynvml.nvmlDeviceGetComputeRunningProcesses(handle), what="the holder listed"
        )
        assert [(p.pid, p.usedGpuMemory) for p in running] == [(holder.pid, GiB + CONTEXT)]  # type: ignore[attr-defined]
        fake_pynvml.nvmlShutdown()
    finally:
        holder.kill()
        holder.wait()
        fake_pynvml.install(None)


def test_the_real_monitor_kills_a_real_bypassing_process_and_leaves_the_limited_one(
    built: Path, dirs: PluginDirs, tmp_path: Path, procs: Path
) -> None:
    """A 2 GiB claim: a process under the limiter holds 1 GiB; then a process run without LD_PRELOAD takes
    1.5 GiB more from the fake driver. The driver's figures put the claim over its cap; the agent kills the
    process that grew last - the bypassing one - and the limited one runs on."""
    api = FakeKube()
    proc_root = tmp_path / "proc"
    claim = add_claim(
        api,
        "mixed",
        [
            Alloc(
                device="gpu-0",
                share_id="00000000-0000-4000-8000-000000000001",
                consumed={"memory": "2Gi", "cores": "50"},
            )
        ],
        [opaque(limiter_config())],
    )
    with plugin_with_nvml(dirs, api, proc_root) as (plugin, driver):
        driver.process_dir = str(procs)
        uuid = driver.gpus[0].uuid
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert not kubelet.prepare(claim)[uid_of(claim)].error
        pod_uid, cid = add_pod(api, "mixed-pod", ["mixed"])
        state = tmp_path / "limiter-state"
        state.mkdir()
        limited = _holder(
            built,
            procs,
            GiB,
            limiter=True,
            uuid=uuid,
            DRAGPU_LIMITER_STATE_DIR=str(state),
            DRAGPU_MEMORY_LIMIT_BY_UUID=f"{uuid}={2 * GiB}",
        )
        bypass: subprocess.Popen[str] | None = None
        try:
            fake_proc(proc_root, limited.pid, pod_uid, cid, limiter=True)
            monitor = monitor_of(plugin)
            handle = fake_pynvml.nvmlDeviceGetHandleByUUID(uuid)
            wait_for(
                lambda: (
                    limited.pid
                    in {vars(p)["pid"] for p in fake_pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
                ),
                what="the limited process seen",
            )
            monitor.watch_once()
            bypass = _holder(built, procs, 1536 * MiB, limiter=False, uuid=uuid)
            fake_proc(proc_root, bypass.pid, pod_uid, cid, limiter=False)

            def watched() -> int | None:
                monitor.watch_once()
                return None if bypass is None else bypass.poll()

            assert wait_for(watched, what="the bypassing process killed") == -signal.SIGKILL
            assert limited.poll() is None
            said = [
                e["message"] for e in _events(api, "Pod", "mixed-pod") if e["reason"] == "MemoryOverLimit"
            ]
            assert len(said) == 1 and f"process {bypass.pid} " in said[0]
        finally:
            for child in (limited, bypass):
                if child is not None:
                    child.kill()
                    child.wait()
            kubelet.close()
