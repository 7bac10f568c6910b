"""What a Python process sees of the GPU's memory: `views.py torch CHUNK MAX` or `views.py nvml`.

Prints `key=value` lines: total=, free= and, for torch, allocated= (tensors of CHUNK bytes, then
smaller ones, until out of memory or MAX bytes); `skip=<reason>` when the library is missing.
Run under the limiter's environment by the GPU check.
"""

from __future__ import annotations

import os
import sys

from workload import torch_or_skip  # type: ignore[import-not-found]  # beside this script


def torch_view(chunk: int, most: int) -> int:
    torch = torch_or_skip()
    if torch is None:
        return 0
    free, total = torch.cuda.mem_get_info()
    print(f"total={total}\nfree={free}", flush=True)
    held = []
    allocated = 0
    size = chunk
    while size >= 1 << 20 and allocated + size <= most:
        try:
            held.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            allocated += size
        except torch.cuda.OutOfMemoryError:
            size //= 2
    print(f"allocated={allocated}", flush=True)
    return 0


def nvml_view() -> int:
    try:
        import pynvml
    except ImportError as exc:
        print(f"skip=nvidia-ml-py is not importable ({exc})")
        return 0
    pynvml.nvmlInit()
    try:
        uuid = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        handle = (
            pynvml.nvmlDeviceGetHandleByUUID(uuid)
            if uuid.startswith("GPU-")
            else pynvml.nvmlDeviceGetHandleByIndex(0)
        )
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        print(f"total={info.total}\nfree={info.free}")
        try:
            v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            print(f"total_v2={v2.total}\nfree_v2={v2.free}")
        except (AttributeError, TypeError, pynvml.NVMLError):
            pass
    finally:
        pynvml.nvmlShutdown()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "torch":
        return torch_view(int(argv[1]), int(argv[2]))
    if argv == ["nvml"]:
        return nvml_view()
    print("usage: views.py torch CHUNK MAX | views.py nvml", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
