"""What a serving engine does to the GPU, under a cap: `serving.py nccl|decode|profile CAP`.

- `nccl`: `torch.distributed` with the NCCL backend, one rank (a file store): an all-reduce of a tensor of
  ones must give ones; prints `allreduce=ok|<error>`, the free memory before and after NCCL's set-up
  (`free_before=`, `free_after=`, `total=`), and `nccl=` (NCCL's version). NCCL places some of its buffers
  in host memory through VMM (`cuMemCreate` with a host location): those must not be charged to the GPU.
- `decode`: a decoder-only transformer built from a config with random weights (no download) decodes one
  token at a time, its KV cache growing by one preallocated block per step, until the framework's
  out-of-memory error; prints `steps=`, `cache_bytes=` and `stopped=`; then the cache is freed
  (`torch.cuda.empty_cache()`) and it decodes `SERVE_STEPS` again: `served=ok|<error>`.
- `profile`: the sequence an engine runs before sizing its KV cache (vLLM's memory profiling): free memory
  before, a warm-up forward pass, a CUDA-graph capture of the decode step, free memory after; prints
  `total=`, `free_before=`, `free_warm=`, `free_after=`, `torch_reserved=`, then allocates a cache of
  nine tenths of `free_after` and prints `cache=ok|<error>`.

Each ends with `finished=1`. `skip=<reason>` when PyTorch (or NCCL) is missing or no GPU is visible. The verdicts are the check's
(`gpucheck/checks/serving.py`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from workload import first_line, say, torch_or_skip  # type: ignore[import-not-found]  # beside this script

SERVE_STEPS = 8
BLOCK_TOKENS = 256
HIDDEN, HEADS, LAYERS = 1024, 16, 4


def nccl(torch: Any) -> None:
    import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

    if not dist.is_available() or not dist.is_nccl_available():
        say("skip=this PyTorch has no NCCL backend")
        return
    torch.cuda.init()
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    free_before, total = torch.cuda.mem_get_info()
    store = os.path.join(tempfile.mkdtemp(prefix="serving-nccl-"), "store")
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        say("allreduce=ok" if bool((t == 1).all()) else "allreduce=wrong result")
    except Exception as exc:  # NCCL's errors: the check reports them
        say(f"allreduce={first_line(exc)}")
    free_after, _ = torch.cuda.mem_get_info()
    say(f"nccl={'.'.join(str(v) for v in torch.cuda.nccl.version())}")
    say(f"total={total}\nfree_before={free_before}\nfree_after={free_after}")
    dist.destroy_process_group()


def model(torch: Any) -> Any:
    layer = torch.nn.TransformerDecoderLayer(HIDDEN, HEADS, 4 * HIDDEN, batch_first=True)
    return torch.nn.TransformerDecoder(layer, LAYERS).to("cuda", torch.float16).eval()


def step(torch: Any, net: Any, x: Any, memory: Any) -> Any:
    with torch.no_grad():
        return net(x, memory)


def decode(torch: Any) -> None:
    torch.manual_seed(0)
    net = model(torch)
    x = torch.randn(1, 1, HIDDEN, device="cuda", dtype=torch.float16)
    cache: list[Any] = []
    steps, stopped = 0, ""
    while True:
        try:
            # One block of keys and values per layer, as a paged KV cache grows.
            cache.append(torch.empty(LAYERS, 2, BLOCK_TOKENS, HIDDEN, device="cuda", dtype=torch.float16))
            memory = cache[-1][0, 0, :1].unsqueeze(0)
            x = step(torch, net, x, memory)[:, -1:]
            steps += 1
        except torch.cuda.OutOfMemoryError as exc:
            stopped = first_line(exc)
            break
        except Exception as exc:  # anything else is a failure the check reports
            stopped = first_line(exc)
            break
    block = LAYERS * 2 * BLOCK_TOKENS * HIDDEN * 2
    say(f"steps={steps}\ncache_bytes={len(cache) * block}\nstopped={stopped}")
    cache.clear()
    torch.cuda.empty_cache()
    try:
        for _ in range(SERVE_STEPS):
            cache.append(torch.empty(LAYERS, 2, BLOCK_TOKENS, HIDDEN, device="cuda", dtype=torch.float16))
            x = step(torch, net, x, cache[-1][0, 0, :1].unsqueeze(0))[:, -1:]
        torch.cuda.synchronize()
        say("served=ok")
    except Exception as exc:
        say(f"served={first_line(exc)}")


def profile(torch: Any) -> None:
    torch.manual_seed(0)
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    free_before, total = torch.cuda.mem_get_info()
    net = model(torch)
    x = torch.randn(8, 64, HIDDEN, device="cuda", dtype=torch.float16)
    step(torch, net, x, x)
    torch.cuda.synchronize()
    free_warm, _ = torch.cuda.mem_get_info()
    static_x = torch.randn(1, 1, HIDDEN, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(torch, net, static_x, static_x)  # warm-up on the side stream, as capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(torch, net, static_x, static_x)
    graph.replay()
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    say(f"total={total}\nfree_before={free_before}\nfree_warm={free_warm}\nfree_after={free_after}")
    say(f"torch_reserved={torch.cuda.memory_reserved()}\ngraph_out={tuple(out.shape)}")
    try:
        kv = torch.empty(int(free_after * 0.9), dtype=torch.uint8, device="cuda")
        kv.fill_(1)
        torch.cuda.synchronize()
        say("cache=ok")
    except Exception as exc:
        say(f"cache={first_line(exc)}")


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("nccl", "decode", "profile"):
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    torch = torch_or_skip()
    if torch is None:
        return 0
    say(f"version={torch.__version__}")
    {"nccl": nccl, "decode": decode, "profile": profile}[sys.argv[1]](torch)
    say("finished=1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
