"""What a context takes on the fake CUDA driver (native/limiter/tests/fake), read from the fake's own header.

The fake's contexts take what a context took on a real H100 (`FAKE_CUDA_CTX_BYTES`, default in
`fake_common.h`), and the limiter charges each process's context to its claim, rounded up to the 2 MiB
allocation granularity: a claim of C bytes lets N processes allocate C - N x CONTEXT_CHARGE.
"""

from __future__ import annotations

import re
from pathlib import Path

FAKE_COMMON_H = (
    Path(__file__).resolve().parents[1] / "native" / "limiter" / "tests" / "fake" / "fake_common.h"
)
GRANULARITY = 2 * 2**20  # the fake's allocation granularity


def _default_context_bytes() -> int:
    m = re.search(r"#define FAKE_CONTEXT_BYTES_DEFAULT (\d+)", FAKE_COMMON_H.read_text())
    assert m, f"{FAKE_COMMON_H} no longer defines FAKE_CONTEXT_BYTES_DEFAULT"
    return int(m.group(1))


CONTEXT_BYTES = _default_context_bytes()
"""What a context takes on the fake device: the drop in its free memory when a process creates one."""

CONTEXT_CHARGE = -(-CONTEXT_BYTES // GRANULARITY) * GRANULARITY
"""What the limiter charges a claim for each process's context."""


def usable(claim_bytes: int, processes: int = 1) -> int:
    """What `processes` processes of a claim of `claim_bytes` can allocate between them."""
    return max(0, claim_bytes - processes * CONTEXT_CHARGE)
