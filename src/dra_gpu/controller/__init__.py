"""The cluster controller: allocates claims of controller-managed DeviceClasses with placement policies.

Kubernetes' scheduler allocates claims itself, first fit. This controller does what it cannot: bin-pack
or spread, affinity, anti-affinity and exclusion between labelled claims (as in Gemini and KubeShare),
while counting every allocation on the same GPUs, the scheduler's included. See `docs/controller.md`.

- `classes`: the marker selector that keeps the scheduler off a class, and the class index;
- `consumers`, `eligibility`: which pods use a claim and on which nodes they can land;
- `reconciler`: one pass of decisions (allocate, release, reserve) with 409 retries;
- `pool_nodes`: slices that put a pool on a node it does not belong to, left out with an Event;
- `leader`: Lease-based leader election; `cache`: list-and-watch caches; `runner`: the threads;
- `events`, `metrics`, `http`: what users and operators see.
"""

from dra_gpu.controller.owned_classes import (
    MANAGED_EXPRESSION,
    MANAGED_SELECTOR,
    is_controller_managed,
    without_marker,
)
from dra_gpu.controller.reconciler import FINALIZER, PassResult, Reconciler, Snapshot
from dra_gpu.controller.runner import Controller

__all__ = [
    "FINALIZER",
    "MANAGED_EXPRESSION",
    "MANAGED_SELECTOR",
    "Controller",
    "PassResult",
    "Reconciler",
    "Snapshot",
    "is_controller_managed",
    "without_marker",
]
