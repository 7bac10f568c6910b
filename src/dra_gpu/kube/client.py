"""The real KubeAPI: the official `kubernetes` client's transport, with JSON in and out.

We use the client for configuration (`dra_gpu.kube.kubeconfig` picks the source), authentication, TLS and retries, but
not its generated models: 37.x models are strict pydantic classes (quantities must be strings, unknown
kwargs rejected) and its `Watch` cannot decode ResourceClaims (it looks for a `V1ResourceClaim` model
that is named `ResourceV1ResourceClaim`). Raw JSON keeps the objects exactly as the API server sent
them, which is also what the slice publisher needs to detect fields an older server dropped.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from dra_gpu.kube import objects, versions
from dra_gpu.kube.api import WatchEvent
from dra_gpu.kube.errors import (
    ApiError,
    Unreachable,
    from_status,
    http_problem,
    transport_errors,
    transport_reason,
)
from dra_gpu.kube.kubeconfig import KubeConfigError, load_api_client
from dra_gpu.kube.resources import RESOURCES, Resource

__all__ = ["KubeClient", "KubeConfigError", "load_api_client"]

Obj = dict[str, Any]


class KubeClient:
    """Implements `dra_gpu.kube.api.KubeAPI` against a real API server."""

    def __init__(self, api_client: Any, field_manager: str = "dra-gpu") -> None:
        self._api = api_client
        self._field_manager = field_manager

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None) -> KubeClient:
        return cls(load_api_client(kubeconfig))

    def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        timeout: float | tuple[float, float] | None = 30.0,
        stream: bool = False,
    ) -> Any:
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        try:
            _, url, header_params, serialized, _ = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(
                method, url, header_params=header_params, body=serialized, _request_timeout=timeout
            )
        except ApiException as exc:
            raise self._error(exc.status or 500, exc.body, url) from None
        except transport_errors() as exc:
            raise Unreachable(f"cannot reach {url}: {transport_reason(exc)}") from None
        if stream and response.status < 400:
            return response.response
        # A refused watch is a plain response with a Status body, like any other error: read it
        # (which also returns the connection to the pool) rather than stream it as events.
        data = response.read() if hasattr(response, "read") else response.data
        if response.status >= 400:
            raise self._error(response.status, data, url)
        return objects.loads(data) if data else {}

    def server_version(self) -> tuple[int, int]:
        """`GET /version`: the server's (major, minor), read once per call (a cluster upgrade changes it)."""
        return versions.from_version_info(self._call("GET", "/version"))

    def get_text(self, path: str, timeout: float = 10.0) -> str:
        """GET a non-JSON path (a pod's /metrics through the API server's proxy); ApiError on failure."""
        from kubernetes.client.exceptions import ApiException

        try:
            _, url, headers, _, _ = self._api.param_serialize(
                method="GET",
                resource_path=path,
                header_params={"Accept": "text/plain"},
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api("GET", url, header_params=headers, _request_timeout=timeout)
        except ApiException as exc:
            raise self._error(exc.status or 500, exc.body, url) from None
        except transport_errors() as exc:
            raise Unreachable(f"cannot reach {url}: {transport_reason(exc)}") from None
        data = response.read() if hasattr(response, "read") else response.data
        if response.status >= 400:
            raise self._error(response.status, data, url)
        return bytes(data).decode("utf-8", "replace")

    @staticmethod
    def _error(status: int, body: Any, url: str = "") -> ApiError:
        """The API's own Status message; for anything else (a proxy's HTML page), one line naming `url`."""
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
        try:
            payload = json.loads(text) if text else {}
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        message = payload.get("message") or (f"{url} answered " if url else "") + http_problem(status, text)
        return from_status(status, payload.get("reason", ""), message)

    @staticmethod
    def _res(kind: str) -> Resource:
        return RESOURCES[kind]

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        res: Obj = self._call("GET", self._res(kind).path(namespace, name))
        return res

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        query = []
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if label_selector:
            query.append(("labelSelector", label_selector))
        data = self._call("GET", self._res(kind).path(namespace), query)
        items: list[Obj] = data.get("items") or []
        for item in items:  # lists omit apiVersion/kind on items
            item.setdefault("apiVersion", self._res(kind).api_version)
            item.setdefault("kind", kind)
        return items, objects.resource_version(data)

    def create(self, kind: str, obj: Obj) -> Obj:
        res = self._res(kind)
        namespace = objects.namespace(obj) or None
        created: Obj = self._call("POST", res.path(namespace), [("fieldManager", self._field_manager)], obj)
        return created

    def update(self, kind: str, obj: Obj) -> Obj:
        meta = obj["metadata"]
        path = self._res(kind).path(meta.get("namespace"), meta["name"])
        updated: Obj = self._call("PUT", path, [("fieldManager", self._field_manager)], obj)
        return updated

    def update_status(self, kind: str, obj: Obj) -> Obj:
        meta = obj["metadata"]
        path = self._res(kind).path(meta.get("namespace"), meta["name"], "status")
        updated: Obj = self._call("PUT", path, [("fieldManager", self._field_manager)], obj)
        return updated

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = (
            {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
            if preconditions
            else None
        )
        self._call("DELETE", self._res(kind).path(namespace, name), body=body)

    def delete_collection(
        self, kind: str, namespace: str | None = None, field_selector: str | None = None
    ) -> None:
        query = [("fieldSelector", field_selector)] if field_selector else []
        self._call("DELETE", self._res(kind).path(namespace), query)

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
        query = [("watch", "true"), ("timeoutSeconds", str(int(timeout_s))), ("allowWatchBookmarks", "true")]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if resource_version:
            query.append(("resourceVersion", resource_version))
        raw = self._call(
            "GET", self._res(kind).path(namespace), query, timeout=(10.0, timeout_s + 10), stream=True
        )
        return self._events(raw, stop)

    def _events(self, raw: Any, stop: threading.Event | None) -> Iterator[WatchEvent]:
        try:
            buffer = b""
            for chunk in raw.stream(4096, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if stop is not None and stop.is_set():
                        return
                    if not line.strip():
                        continue
                    event = objects.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise from_status(
                            int(status.get("code", 500)), status.get("reason", ""), status.get("message", "")
                        )
                    yield WatchEvent(type=event.get("type", ""), object=event.get("object") or {})
        finally:
            raw.release_conn()
