"""Enforcement backends, discovered from the modules of this package.

A module that defines ``BACKEND`` (a ``plan.Backend``) takes part in planning every claim; one that
defines ``HOLD_HANDLERS`` (``plan.HoldHandler`` instances) can undo node-side setup. Adding a sharing
mechanism is adding a module here; nothing else lists them.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from dra_gpu.plugin.sharing.plan import Backend, HoldHandler


@cache
def _discover() -> tuple[tuple[Backend, ...], dict[str, HoldHandler]]:
    backends: list[Backend] = []
    handlers: dict[str, HoldHandler] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "plan":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        backend = getattr(module, "BACKEND", None)
        if backend is not None:
            backends.append(backend)
        for handler in getattr(module, "HOLD_HANDLERS", ()):
            if handler.kind in handlers:
                raise RuntimeError(f"two hold handlers for kind {handler.kind!r} ({info.name})")
            handlers[handler.kind] = handler
    return tuple(sorted(backends, key=lambda b: (b.order, b.name))), handlers


def backends() -> tuple[Backend, ...]:
    return _discover()[0]


def hold_handlers() -> dict[str, HoldHandler]:
    return _discover()[1]


__all__ = ["backends", "hold_handlers"]
