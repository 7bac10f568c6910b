"""A real workload for the overhead check: `torch_bench.py matmul|train|graph ITERATIONS`.

Warms up, then times ITERATIONS steps with CUDA events and prints `seconds=` (GPU time of the timed
steps, host-synchronised) and `wall_seconds=`; `skip=<reason>` when PyTorch or a GPU is missing.
"""

from __future__ import annotations

import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("matmul", "train", "graph"):
        print("usage: torch_bench.py matmul|train|graph ITERATIONS", file=sys.stderr)
        return 2
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        print(f"skip=PyTorch is not importable ({exc})")
        return 0
    if not torch.cuda.is_available():
        print("skip=torch.cuda.is_available() is False")
        return 0
    workload, iterations = argv[0], int(argv[1])
    torch.manual_seed(0)
    dev = torch.device("cuda")
    if workload == "matmul":
        a = torch.randn(2048, 2048, device=dev, dtype=torch.float16)
        b = torch.randn(2048, 2048, device=dev, dtype=torch.float16)

        def step() -> None:
            torch.matmul(a, b)

    elif workload == "train":
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096),
            torch.nn.ReLU(),
            torch.nn.Linear(4096, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 10),
        ).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(256, 1024, device=dev)
        y = torch.randint(0, 10, (256,), device=dev)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()

    else:
        a = torch.randn(1024, 1024, device=dev)
        static_in = torch.randn(1024, 1024, device=dev)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                torch.relu(static_in @ a)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = static_in
            for _ in range(10):
                out = torch.relu(out @ a)

        def step() -> None:
            graph.replay()

    for _ in range(max(5, iterations // 10)):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall = time.perf_counter()
    start.record()
    for _ in range(iterations):
        step()
    end.record()
    torch.cuda.synchronize()
    print(f"seconds={start.elapsed_time(end) / 1000:.6f}")
    print(f"wall_seconds={time.perf_counter() - wall:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
