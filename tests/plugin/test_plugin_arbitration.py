"""Elastic compute through the real gRPC plugin: a limiter claim's ceiling and class reach its limits file,
and every limiter claim with a compute share below 100 % is on its GPU's board, with its own activity file
mounted read-write and the GPU's directory read-only; unprepare takes it all away again."""

from __future__ import annotations

import mmap
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from plugin_harness import (
    NODE,
    PROFILE,
    Alloc,
    Kubelet,
    PluginDirs,
    add_claim,
    cdi_ids,
    class_grant,
    gpu_config,
    opaque,
    registered_kubelet,
    resolve,
    running_plugin,
    two_shares,
    uid_of,
)

from dra_gpu.inventory import SimulatedInventory
from dra_gpu.kube.fake import FakeKube
from dra_gpu.limiter_abi import board
from dra_gpu.plugin.cdi_specs import ClaimSpecs

GPU = SimulatedInventory(PROFILE, seed=NODE).gpus()[0].uuid
GiB = 2**30


def share_claim(
    api: FakeKube, name: str, cores: int, n: int, compute: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A limiter share of gpu-0 as the scheduler allocates it, with the claim's own compute section."""
    limiter: dict[str, Any] = {} if compute is None else {"compute": compute}
    return add_claim(
        api,
        name,
        [
            Alloc(
                share_id=f"00000000-0000-4000-8000-{n:012d}", consumed={"memory": "8Gi", "cores": str(cores)}
            )
        ],
        [
            *([] if compute is None else [class_grant(compute)]),
            opaque(gpu_config("Limiter", limiter=limiter), source="FromClaim"),
        ],
    )


def gpu_dir(dirs: PluginDirs) -> Path:
    return dirs.state_dir / "gpus" / GPU


def limits_line(dirs: PluginDirs, claim: dict[str, Any]) -> str:
    return (dirs.state_dir / "claims" / uid_of(claim) / "limits").read_text().splitlines()[-1]


def activity(dirs: PluginDirs, claim: dict[str, Any]) -> Path:
    return gpu_dir(dirs) / f"{uid_of(claim)}.activity"


def test_an_inference_service_and_a_training_job_share_a_gpu_through_its_board(dirs: PluginDirs) -> None:
    api = FakeKube()
    inference = share_claim(api, "inference", 30, 1, {"limit": 100, "priority": "latency"})
    training = share_claim(api, "training", 20, 2, {"limit": 100, "priority": "besteffort"})
    with registered_kubelet(dirs, api) as (_, kubelet):
        answers = kubelet.prepare(inference, training)
        assert [a.error for a in answers.values()] == ["", ""]
        assert (
            limits_line(dirs, inference)
            == f"device={GPU} memory={8 * GiB} cores=30 limit=100 priority=latency"
        )
        assert (
            limits_line(dirs, training)
            == f"device={GPU} memory={8 * GiB} cores=20 limit=100 priority=besteffort"
        )
        assert sorted(board.read_board(gpu_dir(dirs) / "board")) == sorted(
            [
                board.Entry(uid_of(inference), 30, 100, "latency"),
                board.Entry(uid_of(training), 20, 100, "besteffort"),
            ]
        )
        assert stat.S_IMODE(os.stat(gpu_dir(dirs)).st_mode) == 0o755
        for claim in (inference, training):
            path = activity(dirs, claim)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 and os.path.getsize(path) == 4096
            assert board.read_activity(path) == board.Activity(0, 0, 0, 0, 0)
            own = dirs.state_dir / "claims" / uid_of(claim) / "limiter" / f"{GPU}.activity"
            assert os.path.samefile(own, path), "the claim's state directory holds the same file"

        container = resolve(dirs, cdi_ids(answers[uid_of(inference)]))
        mounts = {m.container_path: (m.host_path, m.options) for m in container.mounts}
        assert mounts[f"/run/dra-gpu/gpus/{GPU}"] == (str(gpu_dir(dirs)), ["ro", "nosuid", "nodev", "bind"])
        own_mount = f"/run/dra-gpu/claims/{uid_of(inference)}/limiter/{GPU}.activity"
        host, options = mounts[own_mount]
        assert os.path.samefile(host, activity(dirs, inference)) and options == [
            "rw",
            "nosuid",
            "nodev",
            "bind",
        ]
        assert not any(uid_of(training) in path for path in mounts), "no mount of the other claim's file"

        assert kubelet.unprepare(inference) == {uid_of(inference): ""}
        assert board.read_board(gpu_dir(dirs) / "board") == [
            board.Entry(uid_of(training), 20, 100, "besteffort")
        ]
        assert not activity(dirs, inference).exists()
        assert kubelet.unprepare(training) == {uid_of(training): ""}
        assert board.read_board(gpu_dir(dirs) / "board") == [], "the GPU's directory stays for its next claim"
        assert [n for n in os.listdir(gpu_dir(dirs)) if n.endswith(".activity")] == []


def test_a_fixed_share_keeps_todays_limits_line_and_still_takes_part(dirs: PluginDirs) -> None:
    api = FakeKube()
    fixed = share_claim(api, "fixed", 25, 1)
    whole = add_claim(
        api,
        "whole",
        [
            Alloc(
                device="gpu-1",
                share_id="00000000-0000-4000-8000-000000000009",
                consumed={"memory": "8Gi", "cores": "100"},
            )
        ],
        [
            class_grant({"priority": "latency"}),
            opaque(gpu_config("Limiter", limiter={"compute": {"priority": "latency"}}), source="FromClaim"),
        ],
    )
    with registered_kubelet(dirs, api) as (_, kubelet):
        assert [a.error for a in kubelet.prepare(fixed, whole).values()] == ["", ""]
        assert limits_line(dirs, fixed) == f"device={GPU} memory={8 * GiB} cores=25"
        assert board.read_board(gpu_dir(dirs) / "board") == [board.Entry(uid_of(fixed), 25, 25, "standard")]
        assert sorted(p.name for p in (dirs.state_dir / "gpus").iterdir()) == [GPU], (
            "a claim at 100 % is unthrottled and takes no part"
        )


def test_a_class_ceiling_below_the_floor_a_claim_was_given_is_raised_to_it(dirs: PluginDirs) -> None:
    api = FakeKube()
    claim = add_claim(
        api,
        "big",
        [Alloc(share_id="00000000-0000-4000-8000-000000000001", consumed={"memory": "8Gi", "cores": "60"})],
        [opaque(gpu_config("Limiter", limiter={"compute": {"limit": 40, "priority": "besteffort"}}))],
    )
    with registered_kubelet(dirs, api) as (_, kubelet):
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        assert limits_line(dirs, claim) == f"device={GPU} memory={8 * GiB} cores=60 priority=besteffort"
        assert board.read_board(gpu_dir(dirs) / "board") == [board.Entry(uid_of(claim), 60, 60, "besteffort")]


def test_after_a_reboot_the_repeated_prepares_rebuild_the_board(dirs: PluginDirs) -> None:
    api = FakeKube()
    a = share_claim(api, "a", 30, 1, {"limit": 80})
    b = share_claim(api, "b", 10, 2, {"priority": "besteffort"})
    with registered_kubelet(dirs, api) as (_, kubelet):
        kubelet.prepare(a, b)
    # The node rebooted: the tmpfs with the GPUs' directories and the CDI specs is empty.
    shutil.rmtree(dirs.state_dir / "gpus")
    for claim in (a, b):
        ClaimSpecs(dirs.cdi_dir, "gpu.dra-gpu.io").remove(uid_of(claim))
    with registered_kubelet(dirs, api, boot_id="boot-2") as (_, kubelet):
        assert [r.error for r in kubelet.prepare(a, b).values()] == ["", ""]
        assert sorted(board.read_board(gpu_dir(dirs) / "board")) == sorted(
            [board.Entry(uid_of(a), 30, 80, "standard"), board.Entry(uid_of(b), 10, 10, "besteffort")]
        )
        for claim in (a, b):
            own = dirs.state_dir / "claims" / uid_of(claim) / "limiter" / f"{GPU}.activity"
            assert os.path.samefile(own, activity(dirs, claim))


def test_the_supervisor_puts_back_a_board_entry_and_activity_file_that_went(dirs: PluginDirs) -> None:
    api = FakeKube()
    a = share_claim(api, "a", 30, 1, {"limit": 100})
    b = share_claim(api, "b", 20, 2)
    with registered_kubelet(dirs, api) as (agent, kubelet):
        kubelet.prepare(a, b)
        board.write_board(gpu_dir(dirs) / "board", [board.Entry(uid_of(b), 20, 20)])
        activity(dirs, a).unlink()
        agent.plugin.preparer.supervise()
        assert sorted(board.read_board(gpu_dir(dirs) / "board")) == sorted(
            [board.Entry(uid_of(a), 30, 100), board.Entry(uid_of(b), 20, 20)]
        )
        own = dirs.state_dir / "claims" / uid_of(a) / "limiter" / f"{GPU}.activity"
        assert os.path.samefile(own, activity(dirs, a))
        # Someone on the host removes the board and a claim's link: both come back, every claim listed.
        (gpu_dir(dirs) / "board").unlink()
        (dirs.state_dir / "claims" / uid_of(b) / "limiter" / f"{GPU}.activity").unlink()
        agent.plugin.preparer.supervise()
        assert sorted(board.read_board(gpu_dir(dirs) / "board")) == sorted(
            [board.Entry(uid_of(a), 30, 100), board.Entry(uid_of(b), 20, 20)]
        )
        assert os.path.samefile(
            dirs.state_dir / "claims" / uid_of(b) / "limiter" / f"{GPU}.activity", activity(dirs, b)
        )


def test_a_rebuilt_checkpoint_leaves_only_the_claims_it_holds_on_the_board(dirs: PluginDirs) -> None:
    api = FakeKube()
    kept = share_claim(api, "kept", 30, 1, {"limit": 100})
    gone = share_claim(api, "gone", 20, 2, {"priority": "besteffort"})
    with registered_kubelet(dirs, api) as (_, kubelet):
        kubelet.prepare(kept, gone)
    (dirs.state_dir / "checkpoint.json").write_text("corrupt")
    api.delete("ResourceClaim", "gone", "default")  # its pod went away while the state was lost
    with running_plugin(dirs, api):
        assert set(dirs.checkpoint().claims) == {uid_of(kept)}
        assert board.read_board(gpu_dir(dirs) / "board") == [board.Entry(uid_of(kept), 30, 100)]
        assert not activity(dirs, gone).exists()
        kubelet = Kubelet(dirs.registration_dir)
        kubelet.register()
        assert kubelet.unprepare(kept) == {uid_of(kept): ""}
        kubelet.close()
    assert board.read_board(gpu_dir(dirs) / "board") == []


def test_the_stale_sweep_removes_the_directory_of_a_gpu_no_claim_is_on(dirs: PluginDirs) -> None:
    """Unprepare keeps a GPU's directory for its next claim; the sweep removes it once no claim is on the
    GPU, and so the directory of a GPU that left the node too, never one with a claim on it."""
    api = FakeKube()
    first = share_claim(api, "first", 30, 1)
    second = share_claim(api, "second", 20, 2)
    gone = dirs.state_dir / "gpus" / "GPU-00000000-0000-4000-8000-0000000000ff"  # a GPU no longer here
    with registered_kubelet(dirs, api) as (agent, kubelet):
        assert [a.error for a in kubelet.prepare(first, second).values()] == ["", ""]
        gone.mkdir(mode=0o755)
        board.make_board(gone / "board")
        (gone / ".board.abcd1234").write_bytes(b"")  # an interrupted write's temporary file
        os.utime(gone / ".board.abcd1234", (0, 0))
        assert kubelet.unprepare(first) == {uid_of(first): ""}
        killed = gpu_dir(dirs) / f".{uid_of(first)}.activity.x1y2z3w4"  # a kill while making an activity file
        killed.write_bytes(b"")
        os.utime(killed, (0, 0))
        agent.plugin.preparer.collect_stale()
        assert board.read_board(gpu_dir(dirs) / "board") == [board.Entry(uid_of(second), 20, 20)]
        assert not killed.exists(), "the sweep removes old temporary files in the GPUs' directories"
        assert not gone.exists(), "the directory of a GPU that left the node goes at the sweep"
        assert kubelet.unprepare(second) == {uid_of(second): ""}
        assert (gpu_dir(dirs) / "board").exists(), "unprepare keeps the directory for the GPU's next claim"
        agent.plugin.preparer.collect_stale()
        assert not gpu_dir(dirs).exists(), "the sweep removes it once no claim is on the GPU"
        assert [a.error for a in kubelet.prepare(first).values()] == [""], "and the next claim makes it again"
        assert board.read_board(gpu_dir(dirs) / "board") == [board.Entry(uid_of(first), 30, 30)]


def test_two_shares_of_one_gpu_in_one_claim_add_up_their_floors_and_ceilings(dirs: PluginDirs) -> None:
    api = FakeKube()
    claim = add_claim(
        api,
        "two",
        two_shares(),
        [
            opaque(
                gpu_config("Limiter", limiter={"compute": {"limit": 50, "priority": "latency"}}),
                requests=["a"],
            ),
            opaque(gpu_config("Limiter"), requests=["b"]),
        ],
    )
    with registered_kubelet(dirs, api) as (_, kubelet):
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        assert limits_line(dirs, claim) == f"device={GPU} memory={3 * GiB} cores=15 limit=55 priority=latency"
        assert board.read_board(gpu_dir(dirs) / "board") == [board.Entry(uid_of(claim), 15, 55, "latency")]


def config_claim(api: FakeKube, name: str, cores: int, n: int) -> dict[str, Any]:
    """A limiter share of gpu-0 whose floor comes from its config alone (no consumable capacity)."""
    return add_claim(
        api,
        name,
        [Alloc(share_id=f"00000000-0000-4000-8000-{n:012d}")],
        [opaque(gpu_config("Limiter", limiter={"cores": cores}), source="FromClaim")],
    )


def test_a_gpu_takes_claims_until_their_floors_fill_it_and_refuses_the_next_in_one_line(
    dirs: PluginDirs,
) -> None:
    """300 claims of 500m cores: each floor is 1 % on the board, so the GPU takes 100 of them and refuses
    the 101st to the 300th, each with one line naming the GPU and the count; the 100 keep their places."""
    api = FakeKube()
    claims = [
        add_claim(
            api,
            f"c{n}",
            [
                Alloc(
                    share_id=f"00000000-0000-4000-8000-{n:012d}",
                    consumed={"memory": "64Mi", "cores": "500m"},
                )
            ],
            [
                class_grant({"limit": 100}),
                opaque(gpu_config("Limiter", limiter={"compute": {"limit": 100}}), source="FromClaim"),
            ],
        )
        for n in range(1, 301)
    ]
    with registered_kubelet(dirs, api) as (_, kubelet):
        first = kubelet.prepare(*claims[:129])
        assert [first[uid_of(c)].error for c in claims[:100]] == [""] * 100
        refused = [first[uid_of(c)].error for c in claims[100:129]]
        refused += [a.error for a in kubelet.prepare(*claims[129:]).values()]
        assert len(refused) == 200
        for error in refused:
            assert "\n" not in error and f"GPU {GPU}: 100 claims with floors summing to 100%" in error, error
        on_board = board.read_board(gpu_dir(dirs) / "board")
        assert sorted(e.claim_uid for e in on_board) == sorted(uid_of(c) for c in claims[:100])
        assert [a.error for a in kubelet.prepare(claims[0]).values()] == [""], (
            "a repeated prepare still passes"
        )
        assert kubelet.unprepare(claims[0]) == {uid_of(claims[0]): ""}
        assert [a.error for a in kubelet.prepare(claims[150]).values()] == [""], "a freed place is taken"
        assert len(board.read_board(gpu_dir(dirs) / "board")) == 100


def test_floors_from_config_alone_never_sum_past_the_gpu(dirs: PluginDirs) -> None:
    api = FakeKube()
    first, second, third = (config_claim(api, n, 60, i) for i, n in enumerate(("a", "b", "c"), 1))
    with registered_kubelet(dirs, api) as (_, kubelet):
        assert kubelet.prepare(first)[uid_of(first)].error == ""
        error = kubelet.prepare(second)[uid_of(second)].error
        assert f"GPU {GPU}: 1 claims with floors summing to 60%" in error and "floor of 60%" in error
        assert not (dirs.state_dir / "claims" / uid_of(second)).exists(), "nothing of it is left"
        assert board.read_board(gpu_dir(dirs) / "board") == [board.Entry(uid_of(first), 60, 60)]
        assert kubelet.unprepare(first) == {uid_of(first): ""}
        assert kubelet.prepare(third)[uid_of(third)].error == ""


def test_an_activity_file_made_before_the_boot_was_in_it_is_upgraded_in_place(dirs: PluginDirs) -> None:
    """A claim prepared by an agent of activity layout 1 keeps its file (its processes map it): the
    supervisor writes this layout's version and the boot into it, the words where they were."""
    api = FakeKube()
    claim = share_claim(api, "old", 30, 1, {"limit": 100})
    with registered_kubelet(dirs, api) as (agent, kubelet):
        assert kubelet.prepare(claim)[uid_of(claim)].error == ""
        path = activity(dirs, claim)
        inode = os.stat(path).st_ino
        old = b"DGPUACT1" + (1).to_bytes(4, "little") + bytes(4) + (7).to_bytes(8, "little") * 5
        with open(path, "r+b") as f:
            f.write(old.ljust(4096, b"\0"))
        assert board.read_activity(path) is None, "layout 1 is not read as this one"
        agent.plugin.preparer.supervise()
        assert os.stat(path).st_ino == inode, "the same file, upgraded in place"
        assert board.read_activity(path) == board.Activity(7, 7, 7, 7, 7)
        assert (
            path.read_bytes()[:72]
            == board.activity_header()[:16] + (7).to_bytes(8, "little") * 5 + board.boot_id()
        )


def board_v1(entries: list[tuple[str, int, int, int]], seq: int) -> bytes:
    """A board as the previous release's agent wrote it (layout version 1: 96-byte entries, the claim UID
    NUL-terminated in 64 bytes, then floor, ceiling and priority)."""
    head = (
        b"DGPUBRD1"
        + (1).to_bytes(4, "little")
        + len(entries).to_bytes(4, "little")
        + seq.to_bytes(8, "little")
    )
    body = b"".join(
        uid.encode().ljust(64, b"\0")
        + b"".join(v.to_bytes(4, "little") for v in (floor, ceiling, prio, 0))
        + bytes(16)
        for uid, floor, ceiling, prio in entries
    )
    return head.ljust(64, b"\0") + body.ljust(16384 - 64, b"\0")


def parse_v1(mapped: mmap.mmap) -> list[tuple[str, int, int, int]]:
    """What the previous release's library reads of the board it mapped (seq even and unchanged)."""
    while True:
        seq = int.from_bytes(mapped[16:24], "little")
        version, count = int.from_bytes(mapped[8:12], "little"), int.from_bytes(mapped[12:16], "little")
        raw = [mapped[64 + 96 * i : 64 + 96 * (i + 1)] for i in range(count)]
        if seq % 2 == 0 and int.from_bytes(mapped[16:24], "little") == seq:
            break
    assert version == 1

    def word(e: bytes, at: int) -> int:
        return int.from_bytes(e[at : at + 4], "little")

    return [(e[:64].rstrip(b"\0").decode(), word(e, 64), word(e, 68), word(e, 72)) for e in raw]


def test_a_board_of_the_previous_layout_is_moved_aside_and_kept_current_for_its_readers(
    dirs: PluginDirs,
) -> None:
    """A process of the previous release mapped the version-1 board and checked its layout then only: the
    agent moves that file aside (the same inode) and keeps it current in version 1, while a new board
    takes the path; the sweep removes both once no claim is on the GPU."""
    api = FakeKube()
    old = share_claim(api, "old", 30, 1, {"limit": 100})
    new = share_claim(api, "new", 20, 2, {"limit": 60, "priority": "latency"})
    with registered_kubelet(dirs, api) as (agent, kubelet):
        assert kubelet.prepare(old)[uid_of(old)].error == ""
        path = gpu_dir(dirs) / "board"
        path.unlink()  # as the previous release left it: its own file, in its own layout
        path.write_bytes(board_v1([(uid_of(old), 30, 100, 1)], 4))
        path.chmod(0o444)
        inode = path.stat().st_ino
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 16384, prot=mmap.PROT_READ) as mapped:
            assert kubelet.prepare(new)[uid_of(new)].error == ""
            aside = gpu_dir(dirs) / board.BOARD_V1_FILE
            assert aside.stat().st_ino == inode, "moved aside, the file the old process maps"
            assert path.stat().st_ino != inode
            both = [board.Entry(uid_of(old), 30, 100), board.Entry(uid_of(new), 20, 60, "latency")]
            assert board.read_board(path) == sorted(both), "the new board carries the old one's claims"
            # A claim this release prepared is there by its stand-in: an activity file the old library maps
            # (version 1), always active, and standard (an always-active latency claim would hold the others).
            stand_in = (uid_of(new) + board.V1_STAND_IN_SUFFIX, 20, 60, 1)
            assert parse_v1(mapped) == sorted([(uid_of(old), 30, 100, 1), stand_in])
            stand_in_file = gpu_dir(dirs) / board.activity_name(stand_in[0])
            assert stand_in_file.read_bytes()[:24] == b"DGPUACT1" + (1).to_bytes(4, "little") + bytes(4) + (
                2**63 - 1
            ).to_bytes(8, "little")
            assert kubelet.unprepare(old) == {uid_of(old): ""}
            assert parse_v1(mapped) == [stand_in], "every rewrite reaches the old mapping"
            assert board.read_board(path) == [both[1]]
            assert kubelet.unprepare(new) == {uid_of(new): ""}
            assert parse_v1(mapped) == []
            assert not stand_in_file.exists(), "the stand-in goes with its claim"
            agent.plugin.preparer.collect_stale()
            assert not gpu_dir(dirs).exists(), "the sweep removes the board and the one moved aside"


def test_a_stand_in_whose_claim_an_older_agent_unprepared_goes_with_the_gpus_directory(
    dirs: PluginDirs,
) -> None:
    """After a rollback the older agent unprepares a claim this release prepared and leaves its stand-in (it
    knows nothing of stand-ins): once no claim is on the GPU, this release's sweep removes it with the rest."""
    api = FakeKube()
    new = share_claim(api, "new", 20, 2, {"limit": 60})
    with registered_kubelet(dirs, api) as (agent, kubelet):
        assert kubelet.prepare(new)[uid_of(new)].error == ""
        aside = gpu_dir(dirs) / board.BOARD_V1_FILE
        aside.write_bytes(board_v1([], 2))
        orphan = gpu_dir(dirs) / board.activity_name(board.v1_stand_in("a-claim-of-this-release"))
        board.make_v1_stand_in(orphan)
        agent.plugin.preparer.collect_stale()
        assert gpu_dir(dirs).exists(), "a claim is on the GPU"
        assert kubelet.unprepare(new) == {uid_of(new): ""}
        agent.plugin.preparer.collect_stale()
        assert not gpu_dir(dirs).exists(), "the orphan stand-in went with the GPU's directory"
