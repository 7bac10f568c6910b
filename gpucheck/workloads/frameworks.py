"""A framework fills the GPU through its own allocator: `frameworks.py FRAMEWORK ALLOCATOR CHUNK MOST [graph] [no-fill]`.

FRAMEWORK is torch, cupy or jax. ALLOCATOR names the allocator the check configured (by environment
for PyTorch and JAX; CuPy's `async` is set here: `cupy.cuda.MemoryAsyncPool`). The steps, each a
`key=value` line or a bare word the check waits for:

1. import the framework and create its context; print `version=`, `total=` (the total the framework
   reports: `torch.cuda.mem_get_info`, CuPy's `runtime.memGetInfo`, JAX's `memory_stats()["bytes_limit"]`)
   and `free=` where there is one, then `ready`, and wait for a line on stdin (the check reads the
   process's usage, its context, meanwhile);
2. with `graph` (PyTorch): capture a CUDA graph that allocates `GRAPH_BYTES` inside the capture,
   replay it, and print `graph=ok` and `graph_bytes=`, or `graph_error=`; without `no-fill`:
   allocate CHUNK bytes at a time through the framework, touching each, until it raises or MOST
   bytes are held; print `allocated=` (graph memory included) and `stopped=` (the exception's type
   and first line, empty when MOST was reached);
3. print `holding` and wait for a line on stdin (the check reads the peak usage), then `done`.

`skip=<reason>` when the framework is not importable or sees no GPU. The verdict is the check's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from workload import first_line, say, torch_or_skip  # type: ignore[import-not-found]  # beside this script

GRAPH_BYTES = 256 << 20
"""What the captured graph allocates, as in the capture that failed under the preload on a real H100."""


def wait() -> None:
    sys.stdin.readline()


def fill(allocate: Callable[[int], Any], chunk: int, most: int, held: list[Any]) -> tuple[int, str]:
    """Allocate `chunk` at a time until the framework raises or `most` is held."""
    allocated = 0
    while allocated + chunk <= most:
        try:
            held.append(allocate(chunk))
        except Exception as exc:  # each framework has its own out-of-memory type: the check judges it
            return allocated, first_line(exc)
        allocated += chunk
    return allocated, ""


def torch_run(chunk: int, most: int, graph: bool, do_fill: bool) -> int:
    torch = torch_or_skip()
    if torch is None:
        return 0
    say(f"version={torch.__version__}")
    a = torch.ones(1024, device="cuda")
    warm = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    warm.fill_(3)
    (a * 2).sum()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    say(f"total={total}\nfree={free}\nready")
    wait()
    held: list[Any] = []
    graph_bytes = 0
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                b = torch.empty(GRAPH_BYTES, dtype=torch.uint8, device="cuda")
                b.fill_(3)
                c = (a * 2).sum()
            g.replay()
            torch.cuda.synchronize()
            if int(c.item()) != 2048 or int(b[-1].item()) != 3:
                say(f"graph_error=the replay computed {c.item()} and {b[-1].item()}, not 2048 and 3")
            else:
                held += [g, b]
                graph_bytes = GRAPH_BYTES
                say(f"graph=ok\ngraph_bytes={graph_bytes}")
        except Exception as exc:
            say(f"graph_error={first_line(exc)}")
            return 0

    def allocate(size: int) -> Any:
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        t.fill_(1)
        return t

    if do_fill:
        allocated, stopped = fill(allocate, chunk, most, held)
        torch.cuda.synchronize()
        say(f"allocated={graph_bytes + allocated}\nstopped={stopped}")
    say("holding")
    wait()
    say("done")
    return 0


def cupy_run(allocator: str, chunk: int, most: int, do_fill: bool) -> int:
    try:
        import cupy  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        say(f"skip=CuPy is not importable ({exc})")
        return 0
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        say(f"skip=CuPy sees no GPU ({first_line(exc)})")
        return 0
    if count < 1:
        say("skip=CuPy sees no GPU")
        return 0
    say(f"version={cupy.__version__}")
    if allocator == "async":
        if not hasattr(cupy.cuda, "MemoryAsyncPool"):
            say(f"skip=CuPy {cupy.__version__} has no cupy.cuda.MemoryAsyncPool")
            return 0
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)

    def allocate(size: int) -> Any:
        x = cupy.empty(size, dtype=cupy.uint8)
        x.data.memset_async(1, size)
        return x

    allocate(1 << 20)
    cupy.cuda.Device().synchronize()
    free, total = cupy.cuda.runtime.memGetInfo()
    say(f"total={total}\nfree={free}\nready")
    wait()
    held: list[Any] = []
    if do_fill:
        allocated, stopped = fill(allocate, chunk, most, held)
        cupy.cuda.Device().synchronize()
        say(f"allocated={allocated}\nstopped={stopped}")
    say("holding")
    wait()
    say("done")
    return 0


def jax_run(allocator: str, chunk: int, most: int, do_fill: bool) -> int:
    try:
        import jax  # type: ignore[import-not-found, unused-ignore]
        import jax.numpy as jnp  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        say(f"skip=JAX is not importable ({exc})")
        return 0
    try:
        device = jax.devices("gpu")[0]
    except Exception as exc:
        say(f"skip=JAX has no GPU backend ({first_line(exc)})")
        return 0
    say(f"version={jax.__version__}")

    def allocate(size: int) -> Any:
        return jax.block_until_ready(jnp.zeros((size,), dtype=jnp.uint8))

    if allocator != "prealloc":
        allocate(1 << 20)  # with preallocation, the first operation takes the whole pool: not yet
    stats = device.memory_stats() or {}
    say(f"total={stats.get('bytes_limit', '')}\nready")
    wait()
    held: list[Any] = []
    if do_fill:
        allocated, stopped = fill(allocate, chunk, most, held)
        say(f"allocated={allocated}\nstopped={stopped}")
    say("holding")
    wait()
    say("done")
    return 0


USAGE = "usage: frameworks.py torch|cupy|jax ALLOCATOR CHUNK MOST [graph] [no-fill]"


def main(argv: list[str]) -> int:
    if (
        len(argv) < 4
        or argv[0] not in ("torch", "cupy", "jax")
        or not (argv[2].isdigit() and argv[3].isdigit())
    ):
        print(USAGE, file=sys.stderr)
        return 2
    framework, allocator, chunk, most = argv[0], argv[1], int(argv[2]), int(argv[3])
    flags = set(argv[4:])
    if flags - {"graph", "no-fill"}:
        print(USAGE, file=sys.stderr)
        return 2
    do_fill = "no-fill" not in flags
    if framework == "torch":
        return torch_run(chunk, most, "graph" in flags, do_fill)
    if framework == "cupy":
        return cupy_run(allocator, chunk, most, do_fill)
    return jax_run(allocator, chunk, most, do_fill)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
