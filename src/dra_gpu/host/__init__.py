"""The host's side of the node agent: the GPU commands (`gpu_commands`: the interface; `nvidia`: the real
ones; `simulated`: their stand-in), MIG commands, the driver root (where the host's driver files are
seen), the memory hook and the dmem cgroup controller.

No imports here: `make gpu-check` loads some of these modules by their paths (`gpucheck/agent.py`).
"""
