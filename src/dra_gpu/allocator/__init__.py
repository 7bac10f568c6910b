"""Structured allocation of DRA claims (no I/O): what the scheduler does, as a library.

    from dra_gpu.allocator import Allocator, AllocationError, placement_for_claim

    alloc = Allocator(slices, classes_by_name, allocated_claims)     # plain v1 JSON dicts
    placement = placement_for_claim(claim, classes_by_name)          # from the class's GpuConfig
    try:
        allocation = alloc.allocate(claim, policy=placement, node_filter=lambda node: ...)
    except AllocationError as exc:
        ...                                                          # str(exc) says which request and why
    claim = builders.with_allocation(claim, allocation)              # write it (kube.builders), then:
    alloc.commit(claim)                                              # count it for the next claims
    alloc.release(claim)                                             # when it is deallocated

`allocate` returns `status.allocation` in `resource.k8s.io/v1` shape: `devices.results[]` (request,
driver, pool, device; `shareID` and `consumedCapacity` with every capacity for multi-allocatable
devices; `tolerations` when the request has some), `devices.config[]` (class configs with
`source: FromClass` naming their requests, then the claim's with `source: FromClaim`), `nodeSelector`
(one `matchFields metadata.name In [node]` term for node-local devices) and `allocationTimestamp`.

Semantics (Kubernetes 1.36 with every DRA gate on): class and request CEL selectors (`cel_env`),
`exactly` with `ExactCount`/`All`, `firstAvailable`, `matchAttribute`/`distinctAttribute` constraints,
consumable capacity with policy defaults and rounding (`capacity`; a multi-allocatable device may
take several of one request's devices, one share each, unless `distinctAttribute` says otherwise),
taints (the slices' and DeviceTaintRules') and tolerations, claims already allocated by anyone counted as in use (`usage`), devices that
consume shared counters (partitionable devices: dynamic MIG placements, counted per pool in
`holdings`) with their KEP-5963 compatibility groups (two devices on one counter set only where neither
names groups or their groups meet, `pools.compatible`), capacity names with the driver's domain resolved
as 1.38 does where the caller says the server does (`resolve_qualified_names`), and only complete pools at their newest generation (`pools`; a pool listing a device or
a counter set twice is invalid). Placement policies and label rules are in `policies`.

Read-only views for callers that audit usage: `Allocator.devices` (`pools.Device`: `index`, `key`,
`label`, `node`, `multi`, `specs`) and `Allocator.usage` (`usage.Usage`, per device index: `holders`
(claim id -> results held), `whole`, `shares`, `used` (summed shares per capacity, or None)). Claim ids are
`metadata.uid`, else namespace/name.

Module map: `cel_env` (CEL), `capacity` (rounding), `pools` (slices to devices), `taint_rules` (DeviceTaintRules), `usage` (what is
held), `index` (cached candidates and usage buckets), `claims` (claim spec), `search` (the search and
its failure messages), `result` (`status.allocation`), `policies` (placement), `core` (the API).

`adminAccess` as the API defines it: such a request gets devices whatever other claims hold of them, its
results say `adminAccess: true`, and it holds nothing for the next claims (the namespace label it needs is
the API server's check).

Not supported, with a clear error or left out: node selectors mixing node-local
devices with `nodeSelector` pools (the allocator does not know node labels).
"""

from dra_gpu.allocator.core import AllocationError, AllocationInput, Allocator
from dra_gpu.allocator.policies import placement_for_claim

__all__ = ["AllocationError", "AllocationInput", "Allocator", "placement_for_claim"]
