"""Kubernetes API access in one place: an interface, the real client, and an in-memory fake.

Everything else in dra_gpu talks to `KubeAPI` with plain JSON dicts shaped exactly as the API server
returns them, so the same code runs against a cluster and against `FakeKube` in tests and the demo.
"""

from dra_gpu.kube.api import KubeAPI, WatchEvent
from dra_gpu.kube.errors import AlreadyExists, ApiError, Conflict, Forbidden, Gone, Invalid, NotFound
from dra_gpu.kube.resources import RESOURCES, Resource

__all__ = [
    "RESOURCES",
    "AlreadyExists",
    "ApiError",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeAPI",
    "NotFound",
    "Resource",
    "WatchEvent",
]
