"""Real workloads for the overhead check: `torch_bench.py NAME=ITERATIONS ...` (matmul, train, graph).

Each workload times its first step (`<name>_first_step_seconds=`, host clock to the GPU's end), warms up,
then times ITERATIONS steps between two CUDA events (which includes the gaps the host leaves between
launches) and prints `<name>_seconds=`; `skip=<reason>` when PyTorch or a GPU
is missing. One process runs every workload: starting PyTorch costs more than the workloads.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from workload import torch_or_skip  # type: ignore[import-not-found]  # beside this script

Step = Callable[[], None]


def matmul(torch: Any, dev: Any) -> Step:
    a = torch.randn(2048, 2048, device=dev, dtype=torch.float16)
    b = torch.randn(2048, 2048, device=dev, dtype=torch.float16)
    return lambda: torch.matmul(a, b)


def train(torch: Any, dev: Any) -> Step:
    nn = torch.nn
    model = nn.Sequential(
        nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device=dev)
    y = torch.randint(0, 10, (256,), device=dev)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return step


def graph(torch: Any, dev: Any) -> Step:
    """Replay of a captured CUDA graph of ten matmul + relu steps."""
    a = torch.randn(1024, 1024, device=dev)
    static_in = torch.randn(1024, 1024, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.relu(static_in @ a)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = static_in
        for _ in range(10):
            out = torch.relu(out @ a)
    return g.replay  # type: ignore[no-any-return]


WORKLOADS = {"matmul": matmul, "train": train, "graph": graph}


def first_step(torch: Any, step: Step) -> float:
    """Host seconds of the first step to its end on the GPU: every kind of launch in it is new to the limiter,
    whose compute cap has each kind's second launch wait for the first one's measurement."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - began


def timed(torch: Any, step: Step, iterations: int) -> float:
    for _ in range(max(5, iterations // 10)):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        step()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / 1000


def main(argv: list[str]) -> int:
    wanted = [a.partition("=") for a in argv]
    if not wanted or any(name not in WORKLOADS or not count.isdigit() for name, _, count in wanted):
        print(f"usage: torch_bench.py NAME=ITERATIONS ... (names: {', '.join(WORKLOADS)})", file=sys.stderr)
        return 2
    torch = torch_or_skip()
    if torch is None:
        return 0
    torch.manual_seed(0)
    dev = torch.device("cuda")
    for name, _, count in wanted:
        step = WORKLOADS[name](torch, dev)
        print(f"{name}_first_step_seconds={first_step(torch, step):.6f}", flush=True)
        print(f"{name}_seconds={timed(torch, step, int(count)):.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
