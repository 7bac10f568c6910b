"""Two agent processes on one node (a rolling update) never work on one claim at once: a claim's lock is a file
in the state directory, locked by one process at a time and gone once nobody holds it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dra_gpu.plugin.locking import KeyLocks, LockTimeout

UID = "3c1a0000-0000-4000-8000-000000000001"
OTHER = "3c1a0000-0000-4000-8000-000000000002"
HOLDER = """
import sys
from pathlib import Path
from dra_gpu.plugin.locking import KeyLocks
root = Path(sys.argv[1])
with KeyLocks(root / "gpu-locks", 30, root / "claim-locks").hold(["claim:" + sys.argv[2]]):
    print("holding", flush=True)
    sys.stdin.readline()
"""


def locks(root: Path) -> KeyLocks:
    return KeyLocks(root / "gpu-locks", 30, root / "claim-locks")


def test_a_claim_is_held_by_one_process_at_a_time_and_its_lock_file_goes_with_the_hold(
    tmp_path: Path,
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), UID],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "holding\n"
        ours = locks(tmp_path)
        with (
            pytest.raises(LockTimeout, match=UID),
            ours.hold([f"claim:{UID}"], deadline=time.monotonic() + 0.2),
        ):
            pass
        with ours.hold([f"claim:{OTHER}"]):
            pass  # another claim is not held up
        got = threading.Event()

        def take() -> None:
            with ours.hold([f"claim:{UID}"]):
                got.set()

        waiter = threading.Thread(target=take)
        waiter.start()
        holder.stdin.write("\n")  # the other process is done with the claim
        holder.stdin.flush()
        waiter.join(30)
        assert got.is_set(), "the claim was not handed over when the other process let it go"
        assert holder.wait(30) == 0
    finally:
        holder.kill()
        holder.wait()
    assert list((tmp_path / "claim-locks").iterdir()) == []
