"""Bad input, each answered for its own claim with a message naming the problem, never as a failed call."""

from __future__ import annotations

from plugin_harness import (
    NODE,
    PROFILE,
    Alloc,
    Kubelet,
    PluginDirs,
    add_claim,
    gpu_config,
    opaque,
    running_plugin,
    simulated_gpu_state,
    uid_of,
)

from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube

GPU0 = SimulatedInventory(PROFILE, seed=NODE).gpus()[0].uuid
SHARE_A = "0f6e3a4e-5d2c-4b8a-9d55-1c0e7f3a9b01"
SHARE_B = "7a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


def prepare_error(dirs: PluginDirs, api: FakeKube, kubelet: Kubelet, claim, **plugin_kw) -> str:
    with running_plugin(dirs, api, **plugin_kw):
        kubelet.register()
        return str(kubelet.prepare(claim)[uid_of(claim) if isinstance(claim, dict) else claim[2]].error)


def test_claim_not_found(dirs, api, kubelet) -> None:
    error = prepare_error(dirs, api, kubelet, ("default", "vanished", "3b1f7c7e-0000-4000-8000-000000000001"))
    assert error == "ResourceClaim default/vanished not found: it was deleted before the pod could start"


def test_uid_mismatch(dirs, api, kubelet) -> None:
    claim = add_claim(api, "recreated")
    error = prepare_error(dirs, api, kubelet, ("default", "recreated", "old-uid"))
    assert error == (
        f"ResourceClaim default/recreated has UID {uid_of(claim)}, but the kubelet asked for UID old-uid: "
        "the claim was deleted and re-created"
    )


def test_not_allocated(dirs, api, kubelet) -> None:
    claim = add_claim(api, "pending", allocated=False)
    error = prepare_error(dirs, api, kubelet, claim)
    assert error == "ResourceClaim default/pending is not allocated (status.allocation is empty)"


def test_allocated_to_another_driver_only(dirs, api, kubelet) -> None:
    claim = add_claim(api, "nic", [Alloc(driver="net.example.com", device="eth-0")])
    error = prepare_error(dirs, api, kubelet, claim)
    assert error == (
        "ResourceClaim default/nic has no device allocated by gpu.dra-gpu.io "
        "(its devices are from net.example.com)"
    )


def test_results_of_other_drivers_are_left_alone(dirs, api, kubelet) -> None:
    claim = add_claim(
        api, "mixed", [Alloc(device="gpu-1"), Alloc(driver="net.example.com", device="eth-0", request="nic")]
    )
    with running_plugin(dirs, api):
        kubelet.register()
        response = kubelet.prepare(claim)[uid_of(claim)]
        assert response.error == ""
        assert [d.device_name for d in response.devices] == ["gpu-1"]


def test_malformed_opaque_config(dirs, api, kubelet) -> None:
    bad = gpu_config("Limiter", limiter={"memory": "lots"})
    claim = add_claim(
        api, "bad-config", [Alloc()], [opaque(gpu_config("Limiter")), opaque(bad, source="FromClaim")]
    )
    error = prepare_error(dirs, api, kubelet, claim)
    assert error.startswith(
        "ResourceClaim default/bad-config: FromClaim config #1 for request 'gpu': invalid GpuConfig:"
    )
    assert "sharing.limiter.memory" in error and "lots" in error
    assert dirs.spec_files() == [] and dirs.claim_dirs() == []


def test_unknown_strategy_in_config(dirs, api, kubelet) -> None:
    claim = add_claim(api, "typo", [Alloc()], [opaque(gpu_config("Timeslicing"))])
    error = prepare_error(dirs, api, kubelet, claim)
    assert "unknown sharing strategy 'Timeslicing'" in error and "TimeSlicing" in error


def test_conflicting_time_slice_interval(dirs, api, kubelet) -> None:
    long = add_claim(
        api,
        "long",
        [Alloc(share_id=SHARE_A)],
        [opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Long"}))],
    )
    short = add_claim(
        api,
        "short",
        [Alloc(share_id=SHARE_B)],
        [opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Short"}))],
    )
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(long, short)
        assert answers[uid_of(long)].error == ""
        assert answers[uid_of(short)].error == (
            f"ResourceClaim default/short: GPU gpu-0 ({GPU0}) is time-sliced with interval Long for claim "
            "default/long; this claim asks for Short. The interval is GPU-wide: use the same interval as the "
            "claims already on the GPU, or another GPU"
        )
        assert simulated_gpu_state(dirs)["timeslice"] == {"0": 3}, "the refused claim changed nothing"
        assert len(dirs.spec_files()) == 1


def test_mps_daemon_failing_to_start(dirs, api, kubelet) -> None:
    commands = SimulatedCommands(
        state_file=dirs.simulated_state,
        fail={"start_mps_daemon": "nvidia-cuda-mps-control: cannot create the pipe directory"},
    )
    claim = add_claim(api, "mps", [Alloc()], [opaque(gpu_config("MPS"))])
    error = prepare_error(dirs, api, kubelet, claim, commands=commands)
    assert error == (
        f"the MPS control daemon for GPU gpu-0 ({GPU0}) failed to start: "
        "nvidia-cuda-mps-control: cannot create the pipe directory"
    )
    state = simulated_gpu_state(dirs)
    assert state["computeMode"] == {} and state["mps"] == {}, "exclusive-process mode is undone"
    assert dirs.spec_files() == [] and dirs.checkpoint().claims == {}


def test_mps_beside_a_limiter_share_is_refused(dirs, api, kubelet) -> None:
    lim = add_claim(
        api,
        "lim",
        [Alloc(share_id=SHARE_A, consumed={"memory": "1Gi", "cores": "10"})],
        [opaque(gpu_config("Limiter"))],
    )
    mps = add_claim(api, "mps", [Alloc(share_id=SHARE_B)], [opaque(gpu_config("MPS"))])
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(lim, mps)
        assert answers[uid_of(lim)].error == ""
        assert "hosts a Limiter share of claim default/lim; MPS needs the GPU in exclusive-process mode" in (
            answers[uid_of(mps)].error
        )


def test_mps_claim_on_two_gpus_is_refused(dirs, api, kubelet) -> None:
    claim = add_claim(
        api,
        "mps2",
        [Alloc(device="gpu-0", request="a"), Alloc(device="gpu-1", request="b")],
        [opaque(gpu_config("MPS"))],
    )
    error = prepare_error(dirs, api, kubelet, claim)
    assert error == (
        "claim default/mps2 asks for MPS on 2 GPUs (gpu-0, gpu-1); a CUDA process connects to one MPS "
        "control daemon, so an MPS claim must have exactly one GPU"
    )


def test_mps_share_beside_another_gpu_of_the_claim_is_refused(dirs, api, kubelet) -> None:
    # An MPS client sees only its daemon's GPU: the whole GPU of request "b" would vanish.
    claim = add_claim(
        api,
        "mixed",
        [Alloc(device="gpu-0", request="a", share_id=SHARE_A), Alloc(device="gpu-1", request="b")],
        [opaque(gpu_config("MPS"), requests=["a"]), opaque(gpu_config("Exclusive"), requests=["b"])],
    )
    error = prepare_error(dirs, api, kubelet, claim)
    assert error == (
        "claim default/mixed asks for MPS on gpu-0 and also has gpu-1; a CUDA process that connects to an "
        "MPS control daemon sees only that daemon's GPU, so an MPS claim must have exactly one GPU (put the "
        "other GPUs in a claim of their own)"
    )
    assert simulated_gpu_state(dirs) == {"computeMode": {}, "timeslice": {}, "mps": {}}


def test_limiter_compute_limit_beside_a_whole_gpu_of_the_claim_is_refused(dirs, api, kubelet) -> None:
    # DRAGPU_CORES_LIMIT throttles every GPU a process uses, the whole GPU of request "b" included.
    claim = add_claim(
        api,
        "mixed",
        [
            Alloc(device="gpu-0", request="a", share_id=SHARE_A, consumed={"memory": "1Gi", "cores": "30"}),
            Alloc(device="gpu-1", request="b"),
        ],
        [opaque(gpu_config("Limiter"), requests=["a"]), opaque(gpu_config("Exclusive"), requests=["b"])],
    )
    error = prepare_error(dirs, api, kubelet, claim)
    assert error == (
        "claim default/mixed has a Limiter share with a compute limit of 30% and also gpu-1 (Exclusive); the "
        "limiter applies one compute limit to every GPU a process uses, so it would throttle gpu-1 too. Put "
        "the Limiter shares and the other GPUs in separate claims"
    )


def test_limiter_memory_limit_beside_a_whole_gpu_of_the_claim_is_accepted(dirs, api, kubelet) -> None:
    # Memory limits are per GPU UUID, so they leave the claim's other GPUs alone.
    claim = add_claim(
        api,
        "mixed",
        [
            Alloc(device="gpu-0", request="a", share_id=SHARE_A, consumed={"memory": "1Gi", "cores": "100"}),
            Alloc(device="gpu-1", request="b"),
        ],
        [opaque(gpu_config("Limiter"), requests=["a"]), opaque(gpu_config("Exclusive"), requests=["b"])],
    )
    assert prepare_error(dirs, api, kubelet, claim) == ""


def test_exclusive_claim_on_a_gpu_in_use_is_refused(dirs, api, kubelet) -> None:
    lim = add_claim(
        api,
        "lim",
        [Alloc(share_id=SHARE_A, consumed={"memory": "1Gi", "cores": "10"})],
        [opaque(gpu_config("Limiter"))],
    )
    whole = add_claim(api, "whole", [Alloc()])
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(lim, whole)
        assert answers[uid_of(whole)].error == (
            f"ResourceClaim default/whole: GPU gpu-0 ({GPU0}) is already prepared for claim default/lim "
            "(Limiter share); the Exclusive strategy needs the whole GPU"
        )


def test_a_whole_device_allocated_twice_is_refused_whatever_the_strategy(dirs, api, kubelet) -> None:
    # Results without a shareID took the whole device: two of them on one GPU are a double allocation
    # (an allocator bug or a stale allocation), even when both ask for a sharing strategy.
    ts = [opaque(gpu_config("TimeSlicing"))]
    first = add_claim(api, "first", [Alloc()], ts)
    second = add_claim(api, "second", [Alloc()], ts)
    share = add_claim(api, "share", [Alloc(share_id=SHARE_A, consumed={"memory": "8Gi", "cores": "10"})], ts)
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(first, second, share)
        assert answers[uid_of(first)].error == ""
        assert answers[uid_of(second)].error == (
            f"ResourceClaim default/second: GPU gpu-0 ({GPU0}) is already prepared for claim default/first "
            "(TimeSlicing share), but this claim was allocated the whole device (its allocation result has "
            "no shareID): the device is allocated twice"
        )
        assert answers[uid_of(share)].error == (
            f"ResourceClaim default/share: GPU gpu-0 ({GPU0}) is held as a whole device by claim "
            "default/first; a TimeSlicing share cannot be added to it"
        )


def test_admin_access_is_not_a_conflict(dirs, api, kubelet) -> None:
    whole = add_claim(api, "whole", [Alloc()])
    monitor = add_claim(api, "monitor", [Alloc(admin_access=True)])
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(whole, monitor)
        assert answers[uid_of(whole)].error == "" and answers[uid_of(monitor)].error == ""


def test_missing_limiter_library(dirs, api, kubelet) -> None:
    dirs.limiter_library.unlink()
    claim = add_claim(
        api, "lim", [Alloc(consumed={"memory": "1Gi", "cores": "10"})], [opaque(gpu_config("Limiter"))]
    )
    error = prepare_error(dirs, api, kubelet, claim)
    assert error == (
        f"the limiter library {dirs.limiter_library} does not exist on this node; the plugin DaemonSet's init "
        "container installs it (check --limiter-library / DRA_GPU_LIMITER_LIBRARY)"
    )


def test_device_not_on_this_node(dirs, api, kubelet) -> None:
    claim = add_claim(api, "elsewhere", [Alloc(pool="node-2")])
    error = prepare_error(dirs, api, kubelet, claim)
    assert error == (
        "ResourceClaim default/elsewhere, request 'gpu', device node-2/gpu-0: the device is in pool 'node-2', "
        "not in this node's pool 'node-1'"
    )


def test_device_unknown_to_this_node(dirs, api, kubelet) -> None:
    claim = add_claim(api, "ghost", [Alloc(device="gpu-7")])
    error = prepare_error(dirs, api, kubelet, claim)
    assert error == (
        "ResourceClaim default/ghost, request 'gpu', device node-1/gpu-7: this node has no such GPU "
        "(it has: gpu-0, gpu-1)"
    )


def test_unhealthy_gpu(dirs, api, kubelet) -> None:
    inventory = SimulatedInventory(PROFILE, seed=NODE)
    inventory.set_health(0, False, "XID 79: GPU has fallen off the bus")
    claim = add_claim(api, "sick", [Alloc()])
    error = prepare_error(dirs, api, kubelet, claim, inventory=inventory)
    assert error == f"GPU gpu-0 ({GPU0}) is unhealthy: XID 79: GPU has fallen off the bus"


def test_one_bad_claim_does_not_fail_the_others(dirs, api, kubelet) -> None:
    good = add_claim(api, "good", [Alloc(device="gpu-1")])
    pending = add_claim(api, "pending", allocated=False)
    with running_plugin(dirs, api):
        kubelet.register()
        answers = kubelet.prepare(good, pending, ("default", "", ""))
        assert answers[uid_of(good)].error == "" and answers[uid_of(good)].devices
        assert "is not allocated" in answers[uid_of(pending)].error
        assert answers[""].error == "the kubelet sent a claim without name, uid"


def test_a_failing_reset_is_reported_and_retried(dirs, api, kubelet) -> None:
    commands = SimulatedCommands(state_file=dirs.simulated_state)
    claim = add_claim(
        api, "ts", [Alloc()], [opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Medium"}))]
    )
    with running_plugin(dirs, api, commands=commands):
        kubelet.register()
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        commands.fail["set_timeslice"] = "nvidia-smi: Unable to set the time slice: Insufficient Permissions"
        error = kubelet.unprepare(claim)[uid_of(claim)]
        assert error == (
            "restoring the Default time-slice interval on GPU gpu-0: "
            "nvidia-smi: Unable to set the time slice: Insufficient Permissions"
        )
        del commands.fail["set_timeslice"]
        assert kubelet.unprepare(claim) == {uid_of(claim): ""}
        assert simulated_gpu_state(dirs)["timeslice"] == {} and dirs.spec_files() == []
