"""Publishing this node's GPUs as a ResourceSlice pool (the node side of DRA).

The device kinds (`devicekinds/`) turn the inventory into `resource.k8s.io/v1` devices; `devices` adds
their taints and checks them, `pool` splits them into slices and plans the API calls of one reconcile,
`dropped` notices fields an older API server silently dropped, and `publisher` runs the loop that keeps
the pool published while the node agent lives.
"""

from dra_gpu.slices.dropped import DroppedFields, dropped_fields
from dra_gpu.slices.pool import MAX_DEVICES_PER_SLICE, PoolPlan, plan_pool, split_devices
from dra_gpu.slices.publisher import SliceError, SlicePublisher

__all__ = [
    "MAX_DEVICES_PER_SLICE",
    "DroppedFields",
    "PoolPlan",
    "SliceError",
    "SlicePublisher",
    "dropped_fields",
    "plan_pool",
    "split_devices",
]
