"""32 concurrent prepare/unprepare calls on overlapping claims, through two plugin instances on one node
(as during a rolling update: one lock file, one checkpoint), end in a consistent node."""

from __future__ import annotations

import random
import threading

from plugin_harness import (
    NODE,
    Alloc,
    Kubelet,
    PluginDirs,
    add_claim,
    gpu_config,
    opaque,
    running_plugin,
    share_claim,
    simulated_gpu_state,
    uid_of,
)

from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.plugin import KubeletPlugin
from dra_gpu.plugin.checkpoint import ClaimState
from dra_gpu.plugin.sharing.plan import ClaimInfo

PROFILE3 = "3xH100-80GB"
CALLERS = 32
CALLS_EACH = 6


def test_concurrent_calls_on_overlapping_claims_end_consistent(dirs: PluginDirs) -> None:
    api = FakeKube()
    gpus = SimulatedInventory(PROFILE3, seed=NODE).gpus()
    ts = [opaque(gpu_config("TimeSlicing", timeSlicing={"interval": "Long"}))]
    claims = {}
    for i in range(3):
        claims[f"lim-{i}"] = share_claim(api, f"lim-{i}", share=i, memory="2Gi", cores="10")
        claims[f"ts-{i}"] = add_claim(
            api, f"ts-{i}", [Alloc(device="gpu-1", share_id=f"00000000-0000-4000-8000-00000000001{i}")], ts
        )
        claims[f"mps-{i}"] = share_claim(
            api, f"mps-{i}", "MPS", device="gpu-2", share=0x20 + i, memory="8Gi", cores="20"
        )
    names = sorted(claims)
    errors: list[str] = []

    with running_plugin(dirs, api, inventory=SimulatedInventory(PROFILE3, seed=NODE)):
        second = KubeletPlugin(  # another plugin process's Preparer: its own lock handle and checkpoint cache
            dirs.config(),
            api,
            SimulatedInventory(PROFILE3, seed=NODE),
            SimulatedCommands(state_file=dirs.simulated_state),
        )
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        start = threading.Barrier(CALLERS)

        def caller(index: int) -> None:
            rng = random.Random(index)
            start.wait()
            for _ in range(CALLS_EACH):
                chosen = [claims[n] for n in rng.sample(names, rng.randint(1, 3))]
                prepare = rng.random() < 0.6
                if index % 2 == 0:
                    if prepare:
                        found = [r.error for r in kubelet.prepare(*chosen).values()]
                    else:
                        found = list(kubelet.unprepare(*chosen).values())
                else:
                    infos = [ClaimInfo(uid_of(c), "default", c["metadata"]["name"]) for c in chosen]
                    if prepare:
                        found = [r.error for r in second.preparer.prepare(infos).values()]
                    else:
                        found = list(second.preparer.unprepare(infos).values())
                errors.extend(e for e in found if e)

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert errors == []

        checkpoint = dirs.checkpoint()
        assert {c.state for c in checkpoint.claims.values()} <= {ClaimState.PREPARE_COMPLETED}
        prepared = {c.name for c in checkpoint.claims.values()}
        assert sorted(dirs.spec_files()) == sorted(
            f"gpu.dra-gpu.io-claim_{uid_of(claims[n])}.json" for n in prepared
        )
        # Limiter claims and MPS claims (whose memory budget the limiter pools) have state.
        assert sorted(dirs.claim_dirs()) == sorted(
            uid_of(claims[n]) for n in prepared if n.startswith(("lim", "mps"))
        )
        state = simulated_gpu_state(dirs)
        assert state["timeslice"] == ({"1": 3} if any(n.startswith("ts") for n in prepared) else {})
        mps_in_use = any(n.startswith("mps") for n in prepared)
        assert set(state["mps"]) == ({gpus[2].uuid} if mps_in_use else set())
        assert state["computeMode"] == ({gpus[2].uuid: "EXCLUSIVE_PROCESS"} if mps_in_use else {})

        assert set(kubelet.unprepare(*claims.values()).values()) == {""}
        kubelet.close()
        second.lock.close()
    assert dirs.spec_files() == [] and dirs.claim_dirs() == []
    assert simulated_gpu_state(dirs) == {"computeMode": {}, "timeslice": {}, "mps": {}}
