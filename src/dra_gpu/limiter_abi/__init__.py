"""The limiter's file formats, the one Python description of the C library's ABI: the limits file
(`limits`), the per-claim accounting region and the floor beside it (`region`), and each GPU's
arbitration board and activity files (`board`).

Standard library only and no project imports: the plugin writes these files, the monitor reads them,
and `make gpu-check` loads the modules by path on a node without the agent installed.
"""
