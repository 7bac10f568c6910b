"""The limiter's limits file and the paths it is read from in a container (native/limiter/src/limits.c).

The node agent writes one limits file per claim (`plugin/sharing/modes/limiter.py` renders it); the library
reads it at the claims root of the container. These names and bounds are the library's: keep them in
step with limits.c.
"""

from __future__ import annotations

CONTAINER_LIBRARY = "/usr/local/lib/dra-gpu/libdragpu-limiter.so.1"
CONTAINER_CLAIMS_ROOT = "/run/dra-gpu/claims"
CONTAINER_GPUS_ROOT = "/run/dra-gpu/gpus"
"""Where each GPU's arbitration directory is in the container (the library's GPUS_ROOT)."""
CONTAINER_PRELOAD = "/etc/ld.so.preload"
LIMITS_FILE = "limits"
STATE_DIR = "limiter"
PRELOAD_FILE = "ld.so.preload"
LIMITS_VERSION = 1
MAX_MEMORY = 2**64 - 1
"""The largest byte count the library reads (an unsigned 64-bit integer)."""
MAX_DEVICES = 16
"""The devices the library takes from one claim's limits file (DL_MAX_DEVICES)."""
MAX_CLAIM_REF = 63 + 1 + 253
"""`claim=<namespace>/<name>`: the longest the library takes, and the longest Kubernetes allows."""
