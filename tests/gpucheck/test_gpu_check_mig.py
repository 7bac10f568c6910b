"""The GPU check's MIG cycle: what it reads from the driver's outputs, and when it does nothing at all."""

from __future__ import annotations

import pytest
from repo_paths import TESTS

from gpucheck.checks import mig
from gpucheck.proc import Ran

RECORD = TESTS / "fixtures" / "mig"
H200 = "GPU-f792be30-c689-6019-e748-f4c3d1b0056e"
LISTING = f"""GPU 0: NVIDIA H200 (UUID: {H200})
  MIG 1g.18gb     Device  0: (UUID: MIG-11111111-2222-3333-4444-555555555555)
GPU 1: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000001)
  MIG 1g.18gb     Device  0: (UUID: MIG-99999999-2222-3333-4444-555555555555)
"""


def test_the_smallest_profile_is_read_from_a_real_h200s_list() -> None:
    """The 1-slice profile without media extensions: `1g.18gb`, id 19 (`+me` is id 20 and listed after it)."""
    assert mig.smallest_profile((RECORD / "h200-lgip.txt").read_text()) == ("1g.18gb", 19)


def test_the_instance_is_found_under_the_checked_gpu_only() -> None:
    assert mig.mig_uuid(LISTING, H200, "1g.18gb") == "MIG-11111111-2222-3333-4444-555555555555"
    assert mig.mig_uuid(LISTING, H200, "3g.71gb") is None
    assert (
        mig.mig_uuid(LISTING.split("GPU 1")[0], "GPU-00000000-0000-0000-0000-000000000001", "1g.18gb") is None
    )


@pytest.mark.parametrize(
    ("rc", "out", "refused"),
    [
        (0, "Enabled MIG Mode for GPU 00000000:18:00.0\nAll done.", False),
        (
            0,
            "Warning: MIG mode is in pending enable state for GPU 00000000:18:00.0 and will be enabled after "
            "a GPU reset\nAll done.",
            True,
        ),
        (3, "Unable to enable MIG Mode for GPU 00000000:18:00.0: Not Supported", True),
        (4, "Unable to enable MIG Mode for GPU 00000000:18:00.0: Insufficient Permissions", True),
    ],
)
def test_a_mode_change_that_is_not_done_now_is_a_refusal_in_the_drivers_words(
    rc: int, out: str, refused: bool
) -> None:
    why = mig.mode_change_refused(Ran(["nvidia-smi", "-mig", "1"], rc, out, "", 0.1))
    assert bool(why) == refused
    if refused:
        assert out.splitlines()[0] in why


def test_without_being_asked_it_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """No driver call at all: the context is never touched (None would fail on any use)."""
    monkeypatch.delenv(mig.ENV, raising=False)
    [result] = mig.mig_cycle(None)  # type: ignore[arg-type]
    assert result.status == "skip" and f"{mig.ENV}=1" in result.summary
