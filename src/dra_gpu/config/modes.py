"""Every sharing mode declared in one place: the node setting its GPUs need, whether such a GPU is split
between claims, what a share of it is limited in, whether a claim of it may span several GPUs, and which
modes may share a GPU with it.

The readers: the slice publisher (which GPUs are published shareable), the device classes (which GPUs a
class selects), the claim admission policy (which classes take capacity requests, which one device per
claim) and prepare (`plugin/sharing/modes/`: which shares may meet on one GPU). The allocator reads none
of it: it follows what the publisher published. A mode added to `Strategy` without a line here fails
`tests/config/test_sharing_modes_table.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dra_gpu.config.claim import Strategy
from dra_gpu.config.node import GpuSharingMode


@dataclass(frozen=True)
class SharingMode:
    strategy: Strategy
    node_mode: GpuSharingMode
    """The `--sharing` setting of the GPUs this mode's claims go on (their `sharing` attribute)."""
    limits: frozenset[str]
    """What each share is held to (capacity names): `memory`, `cores`; empty where nothing enforces a share."""
    beside: frozenset[Strategy]
    """The modes whose claims may be on the same GPU at the same time; empty for a mode that takes it whole."""
    one_device: bool = False
    """A claim of this mode gets one device (MPS: one control daemon's pipe per container)."""


_SHARED_GPU = frozenset({Strategy.TIME_SLICING, Strategy.LIMITER})

MODES: Mapping[Strategy, SharingMode] = {
    mode.strategy: mode
    for mode in (
        SharingMode(Strategy.EXCLUSIVE, GpuSharingMode.EXCLUSIVE, limits=frozenset(), beside=frozenset()),
        # Both run in the default compute mode: time-slicing sets the GPU's interval, the limiter
        # holds each share to its memory and cores.
        SharingMode(Strategy.TIME_SLICING, GpuSharingMode.SHARED, limits=frozenset(), beside=_SHARED_GPU),
        SharingMode(Strategy.LIMITER, GpuSharingMode.SHARED, frozenset({"memory", "cores"}), _SHARED_GPU),
        # The control daemon puts the GPU in exclusive-process mode, which locks out every other process.
        SharingMode(
            Strategy.MPS,
            GpuSharingMode.MPS,
            frozenset({"memory", "cores"}),
            frozenset({Strategy.MPS}),
            one_device=True,
        ),
    )
}


def shares_gpu(mode: SharingMode) -> bool:
    """Whether a GPU of this mode is split between claims (published with consumable capacity)."""
    return bool(mode.beside)


SHAREABLE_NODE_MODES = frozenset(m.node_mode for m in MODES.values() if shares_gpu(m))
"""The `--sharing` settings whose GPUs are published shareable."""


@dataclass(frozen=True)
class _Index:
    """Each mode of a `MODES` table by its `Strategy` value, and the values it may meet: a prepare checks
    them against every other share on the GPU (50 of them on a busy one), so they are looked up, not
    searched for."""

    table: Mapping[Strategy, SharingMode]
    by_value: Mapping[str, SharingMode]
    beside: Mapping[str, frozenset[str]]
    whole_gpu: frozenset[str]


def _indexed(table: Mapping[Strategy, SharingMode]) -> _Index:
    by_value = {m.strategy.value: m for m in reversed(list(table.values()))}  # (the first of a value wins)
    return _Index(
        table=table,
        by_value=by_value,
        beside={value: frozenset(s.value for s in mode.beside) for value, mode in by_value.items()},
        whole_gpu=frozenset(value for value, mode in by_value.items() if not shares_gpu(mode)),
    )


_index = _indexed(MODES)


def _current() -> _Index:
    """The index of the table as it is now (made again when `MODES` was replaced, as a test adding a
    made-up mode does)."""
    global _index
    if _index.table is not MODES:
        _index = _indexed(MODES)
    return _index


def mode_named(strategy: str) -> SharingMode | None:
    """The mode of a `Strategy` value as a checkpoint record stores it; None for a value of no mode."""
    return _current().by_value.get(strategy)


def takes_whole_gpu(strategy: str) -> bool:
    """Whether a claim of this mode (its `Strategy` value) holds its GPU alone."""
    return strategy in _current().whole_gpu


def may_meet(strategy: str, other: str) -> bool:
    """Whether shares of the two modes (their `Strategy` values) may be on one GPU at once."""
    return other in _current().beside.get(strategy, frozenset())
