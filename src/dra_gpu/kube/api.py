"""The small interface every component uses to reach the API server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Protocol, TypedDict

Obj = dict[str, Any]


class WatchEvent(TypedDict):
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: Obj


class KubeAPI(Protocol):
    """Generic verbs over the kinds in `dra_gpu.kube.resources.RESOURCES`.

    Selectors use the API server's syntax (`spec.nodeName=n,spec.driver=d`, `app=x`). Errors are the
    classes in `dra_gpu.kube.errors`. Updates carry `metadata.resourceVersion`; a stale one is a Conflict.
    """

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj: ...

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        """Items and the list's resourceVersion (to start a watch from)."""
        ...

    def create(self, kind: str, obj: Obj) -> Obj: ...

    def update(self, kind: str, obj: Obj) -> Obj:
        """PUT the main resource; status changes are ignored for kinds with a status subresource."""
        ...

    def update_status(self, kind: str, obj: Obj) -> Obj:
        """PUT the status subresource; spec and metadata changes are ignored."""
        ...

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        """Delete with optional preconditions; an object with finalizers only gets deletionTimestamp."""
        ...

    def delete_collection(
        self, kind: str, namespace: str | None = None, field_selector: str | None = None
    ) -> None: ...

    def watch(
        self,
        kind: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,
        timeout_s: float = 60.0,
        stop: threading.Event | None = None,
    ) -> Iterator[WatchEvent]:
        """Events after `resource_version` until the timeout or `stop`; Gone when it is too old."""
        ...

    def server_version(self) -> tuple[int, int]:
        """The server's Kubernetes (major, minor), from `GET /version` (`kube.versions`)."""
        ...
