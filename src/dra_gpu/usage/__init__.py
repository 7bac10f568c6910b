"""`dra-gpu usage`: who holds which share of which GPU, read from the cluster's slices and claims.

`collect` turns listed objects into a plain model (no I/O, so it is tested against real 1.36 objects);
`render` prints that model as a table for people or as JSON with stable keys for scripts.
"""

from dra_gpu.usage.collect import Gpu, Holder, Node, Pending, PendingRequest, Taint, Usage, collect
from dra_gpu.usage.render import render_json, render_table, to_json

__all__ = [
    "Gpu",
    "Holder",
    "Node",
    "Pending",
    "PendingRequest",
    "Taint",
    "Usage",
    "collect",
    "render_json",
    "render_table",
    "to_json",
]
