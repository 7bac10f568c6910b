"""A small, self-contained Container Device Interface (CDI) library.

It writes the spec files a container runtime reads, validates names and versions the way the
reference Go library (``tags.cncf.io/container-device-interface``) does, and resolves device
names the way a runtime injects them, so tests can assert what a container would receive.
It does not depend on the rest of the driver.

Modules: ``spec`` (models), ``names``, ``version``, ``validation``, ``files`` (read, atomic write,
remove), ``resolver`` (load a spec directory, resolve devices), ``runtime_check``.
"""

from cdi.errors import CDIError

__all__ = ["CDIError"]
