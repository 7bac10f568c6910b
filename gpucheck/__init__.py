"""The GPU check: proves the driver on a node with a real NVIDIA GPU (`make gpu-check`).

It needs only the standard library to start: the project and its bundled dependencies are put on
the path of the processes that need them. See the README's "Checking a GPU node" section.
"""
