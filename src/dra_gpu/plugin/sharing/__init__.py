"""Enforcement backends, listed here once: the sharing modes (`modes/`) and the steps every claim goes
through whatever its mode (`steps/`).

A module defines ``BACKEND`` (a ``plan.Backend``) to take part in planning every claim, and
``HOLD_HANDLERS`` (``plan.HoldHandler`` instances) if it changes the node. Adding a sharing mechanism
is adding such a module and naming it below; nothing else (the preparer included) knows the
backends by name.
"""

from __future__ import annotations

from dra_gpu.plugin.sharing.modes import arbitration, exclusive, limiter, limiter_region, timeslicing
from dra_gpu.plugin.sharing.modes.mps import daemon as mps_daemon
from dra_gpu.plugin.sharing.modes.mps import namespaces as mps_namespaces
from dra_gpu.plugin.sharing.plan import Backend, HoldHandler
from dra_gpu.plugin.sharing.steps import device_access, directories, driver_memory, usage_facts

BACKENDS: tuple[Backend, ...] = tuple(
    sorted(
        (
            device_access.BACKEND,
            exclusive.BACKEND,
            timeslicing.BACKEND,
            mps_daemon.BACKEND,
            mps_namespaces.BACKEND,
            limiter.BACKEND,
            driver_memory.BACKEND,
            usage_facts.BACKEND,
        ),
        key=lambda b: (b.order, b.name),
    )
)
"""Every backend, in the order they contribute to a plan."""


def _handlers() -> dict[str, HoldHandler]:
    handlers: dict[str, HoldHandler] = {}
    for module in (
        arbitration,
        directories,
        driver_memory,
        limiter_region,
        mps_daemon,
        mps_namespaces,
        timeslicing,
    ):
        for handler in module.HOLD_HANDLERS:
            if handler.kind in handlers:
                raise RuntimeError(f"two hold handlers for kind {handler.kind!r} ({module.__name__})")
            handlers[handler.kind] = handler
    return handlers


HOLD_HANDLERS = _handlers()
"""Hold kind -> the handler that applies and releases holds of that kind."""


def backends() -> tuple[Backend, ...]:
    """The backends as the table is when a preparer is built (`BACKENDS`)."""
    return BACKENDS


def hold_handlers() -> dict[str, HoldHandler]:
    """The handlers as the table is when a preparer is built (`HOLD_HANDLERS`)."""
    return dict(HOLD_HANDLERS)


__all__ = ["BACKENDS", "HOLD_HANDLERS", "backends", "hold_handlers"]
