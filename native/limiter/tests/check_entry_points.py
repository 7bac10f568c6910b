"""Every driver entry point that allocates, maps, imports, exports, retains or instantiates a graph is wrapped.

The candidates are the entry points of the toolkit's cudaTypedefs.h (each ABI variant, as the driver exports
it) whose names say they may bring device memory into being; each must be wrapped under every one of its
exported names (libdragpu-limiter.map), or be named below with the reason it need not be. A new toolkit's
new entry point fails here until it is wrapped or classified. Without the toolkit the committed list
(cuda-entry-points.txt, from CUDA 13.0) is checked; with it, the list must also equal the toolkit's
(regenerate with --write).

usage: check_entry_points.py <libdragpu-limiter.map> [<CUDA include dir>] [--write]
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake"))
from gen_proctable import exported_names, parse_typedefs

LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda-entry-points.txt")
CANDIDATE = re.compile(
    r"Alloc|Create|Map|Import|Export|Instantiate|Retain|Open|Load|Bind|Reserve|Upload|SetLimit|GetMemHandle|"
    r"Register|Clone"
)
FLOOR = (
    "not charged by the library; the node agent's floor (NVML's per-process figure) holds it within a watch"
)
NOT_DEVICE_MEMORY = {
    "cuDeviceRegisterAsyncNotification": "a callback",
    "cuEventCreate": "an event",
    "cuFuncIsLoaded": "a query",
    "cuFuncLoad": "loads a function of a module already loaded",
    "cuGraphConditionalHandleCreate": "a handle",
    "cuGraphCreate": "an empty graph (its allocation nodes are wrapped)",
    "cuGraphClone": "the driver refuses to clone graphs with memory allocation nodes",
    "cuGraphMemAllocNodeGetParams": "a query",
    "cuGraphNodeFindInClone": "a query",
    "cuGraphRetainUserObject": "a reference to a host object",
    "cuGraphicsResourceSetMapFlags": "flags",
    "cuGreenCtxStreamCreate": "a stream",
    "cuImportExternalSemaphore": "a semaphore",
    "cuIpcOpenEventHandle": "an event",
    "cuLinkCreate": "a JIT linker state on the host",
    "cuLogsRegisterCallback": "a callback",
    "cuMemAddressReserve": "virtual address space only (cuMemMap of a handle is charged)",
    "cuMemAllocHost": "pinned host memory",
    "cuMemGetAllocationGranularity": "a query",
    "cuMemGetAllocationPropertiesFromHandle": "a query",
    "cuMemHostAlloc": "pinned host memory",
    "cuMemHostRegister": "pins host memory",
    "cuMemPoolCreate": "a pool holds nothing until allocated from (its allocations are wrapped)",
    "cuModuleGetLoadingMode": "a query",
    "cuStreamCreate": "a stream",
    "cuStreamCreateWithPriority": "a stream",
    "cuSurfObjectCreate": "a view of an array",
    "cuTensorMapEncodeIm2col": "a descriptor on the host",
    "cuTensorMapEncodeIm2colWide": "a descriptor on the host",
    "cuTensorMapEncodeTiled": "a descriptor on the host",
    "cuTensorMapReplaceAddress": "a descriptor on the host",
    "cuTexObjectCreate": "a view of memory",
    "cuTexRefCreate": "a view of memory",
    "cuUserObjectCreate": "a host object",
    "cuUserObjectRetain": "a host object",
}
HELD_BY_FLOOR = {
    "cuExternalMemoryGetMappedBuffer": f"memory another API (Vulkan, another process) allocated: {FLOOR}",
    "cuExternalMemoryGetMappedMipmappedArray": f"memory another API allocated: {FLOOR}",
    "cuImportExternalMemory": f"memory another API allocated: {FLOOR}",
    "cuGetExportTable": f"the runtime's private table: {FLOOR}",
    "cuGraphicsMapResources": f"a graphics API's memory: {FLOOR}",
    "cuGraphicsResourceGetMappedMipmappedArray": f"a graphics API's memory: {FLOOR}",
    "cuGraphicsResourceGetMappedPointer": f"a graphics API's memory: {FLOOR}",
    "cuGraphicsSubResourceGetMappedArray": f"a graphics API's memory: {FLOOR}",
    "cuGreenCtxCreate": f"a green context's memory: {FLOOR}",
    "cuLibraryLoadData": f"module images: {FLOOR}",
    "cuLibraryLoadFromFile": f"module images: {FLOOR}",
    "cuModuleLoad": f"module images: {FLOOR}",
    "cuModuleLoadData": f"module images: {FLOOR}",
    "cuModuleLoadDataEx": f"module images: {FLOOR}",
    "cuModuleLoadFatBinary": f"module images: {FLOOR}",
    "cuMemMapArrayAsync": f"maps a charged cuMemCreate handle into a sparse array, which keeps it: {FLOOR}",
    "cuMemPoolExportPointer": "the allocation stays charged to the exporting pool (README: Known limits)",
    "cuMemPoolExportToShareableHandle": "the pool's allocations stay charged to it",
    "cuMemPoolImportFromShareableHandle": f"another process's pool: {FLOOR}",
    "cuMemPoolImportPointer": "charged to the exporting pool, which the driver keeps until every importer frees",
    "cuMulticastBindAddr": "binds memory already charged",
    "cuMulticastBindMem": "binds memory already charged",
    "cuMulticastCreate": f"NCCL's multicast objects: {FLOOR}",
}


def entry_points(typedefs: str) -> dict[str, list[str]]:
    variants = parse_typedefs(typedefs)
    return {base: [n for _, _, n in exported_names(base, variants[base])] for base in sorted(variants)}


def read_list() -> dict[str, list[str]]:
    with open(LIST) as f:
        rows = [line.split() for line in f if line.strip() and not line.startswith("#")]
    return {row[0]: row[1:] for row in rows}


def write_list(points: dict[str, list[str]]) -> None:
    with open(LIST, "w") as f:
        f.write(
            "# Every driver entry point of cudaTypedefs.h and the names it is exported under (check_entry_points.py)\n"
        )
        for base, names in points.items():
            f.write(" ".join([base, *names]) + "\n")


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--write"]
    if len(args) not in (1, 2):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with open(args[0]) as f:
        wrapped = set(re.findall(r"\b(cu\w+)\b", f.read()))
    problems = []
    points = read_list() if "--write" not in sys.argv else {}
    if len(args) == 2:
        with open(os.path.join(args[1], "cudaTypedefs.h")) as f:
            toolkit = entry_points(f.read())
        if "--write" in sys.argv:
            write_list(toolkit)
            points = toolkit
        elif toolkit != points:
            problems.append(
                f"{LIST} is not the toolkit's list: run check_entry_points.py --write with its headers"
            )
    allowed = {**NOT_DEVICE_MEMORY, **HELD_BY_FLOOR}
    candidates = {base for base in points if CANDIDATE.search(base)}
    for base in sorted(candidates - set(allowed)):
        missing = [n for n in points[base] if n not in wrapped]
        if missing:
            problems.append(
                f"{base}: not wrapped as {', '.join(missing)} (wrap it, or say in check_entry_points.py why not)"
            )
    problems += [f"{base}: classified but no such entry point" for base in sorted(set(allowed) - set(points))]
    problems += [
        f"{base}: classified but also wrapped"
        for base in sorted(allowed)
        if set(points.get(base, [])) & wrapped
    ]
    for p in problems:
        print(f"check_entry_points: {p}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"check_entry_points: {len(candidates)} candidates of {len(points)} entry points: "
        f"{len(candidates) - len(allowed)} wrapped on every name, {len(allowed)} classified"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
