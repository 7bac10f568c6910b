"""A list-and-watch cache per kind (client-go's informer, reduced to what the controller needs).

The controller decides from this cache, not from one LIST per decision. Its own writes go in at once
(`assume`, like the scheduler's assume cache): a watch event may arrive after the next pass starts, and
a pass that did not see the allocation it just wrote would hand the same capacity out twice. An assumed
object is replaced only by one with a newer resourceVersion.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from dra_gpu.controller.backoff import ApiReachability, Backoff
from dra_gpu.kube import Gone, KubeAPI, objects

Obj = dict[str, Any]
Key = tuple[str, str]  # namespace ("" for cluster-scoped), name
log = logging.getLogger(__name__)


def object_key(obj: Obj) -> Key:
    return objects.namespace(obj), objects.name(obj)


def _rv(obj: Obj) -> int:
    try:
        return int(objects.resource_version(obj) or 0)
    except ValueError:
        return 0


class Informer:
    """The objects of one kind, kept current by a watch; `on_change(event_type, obj)` after each change."""

    def __init__(
        self,
        api: KubeAPI,
        kind: str,
        on_change: Callable[[str, Obj], None] | None = None,
        *,
        watch_timeout_s: float = 300.0,
        retry_s: float = 1.0,
        max_retry_s: float = 60.0,
        reachability: ApiReachability | None = None,
    ) -> None:
        self.api, self.kind = api, kind
        self._on_change = on_change
        self._watch_timeout_s = watch_timeout_s
        self._backoff = Backoff(retry_s, max(retry_s, max_retry_s))
        self._reachability = reachability or ApiReachability()
        self._lock = threading.Lock()
        self._items: dict[Key, Obj] = {}
        self._synced = threading.Event()

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._items.get((namespace, name))

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    def assume(self, obj: Obj) -> None:
        """Put our own write in at once, unless the cache already holds something newer.

        A write that removed the last finalizer of an object being deleted deleted it: the object
        is dropped, not put back (its DELETED event may already have been applied).
        """
        with self._lock:
            if objects.deleting(obj) and not objects.finalizers(obj):
                self._items.pop(object_key(obj), None)
                return
            current = self._items.get(object_key(obj))
            if current is None or _rv(obj) >= _rv(current):
                self._items[object_key(obj)] = obj

    def forget(self, obj: Obj) -> None:
        with self._lock:
            self._items.pop(object_key(obj), None)

    def relist(self) -> str:
        items, rv = self.api.list(self.kind)
        with self._lock:
            self._items = {object_key(o): o for o in items}
        self._synced.set()
        self._notify("SYNC", {})
        return rv

    def run(self, stop: threading.Event) -> None:
        """List, then watch from the list's resourceVersion; start over on 410 Gone, and after an error
        (the API server down, a dropped connection) once the backoff has passed."""
        rv: str | None = None
        caller = f"informer {self.kind}"
        while not stop.is_set():
            try:
                if rv is None:
                    rv = self.relist()
                    self._backoff.reset()
                    self._reachability.succeeded(caller)
                for event in self.api.watch(
                    self.kind, resource_version=rv, timeout_s=self._watch_timeout_s, stop=stop
                ):
                    obj = event["object"]
                    if event["type"] == "BOOKMARK":
                        rv = objects.resource_version(obj) or rv
                        continue
                    self._apply(event["type"], obj)
                    rv = objects.resource_version(obj) or rv
            except Gone:
                rv = None
            except Exception as exc:  # ApiError, or a transport failure (connection reset, timeout)
                rv = None
                delay = self._backoff.next_delay()
                self._reachability.failed(caller, exc, delay)
                stop.wait(delay)

    def _apply(self, event_type: str, obj: Obj) -> None:
        key = object_key(obj)
        with self._lock:
            if event_type == "DELETED":
                self._items.pop(key, None)
            else:
                current = self._items.get(key)
                if current is not None and _rv(current) > _rv(obj):
                    return  # an assumed write of ours is newer than this event
                self._items[key] = obj
        self._notify(event_type, obj)

    def _notify(self, event_type: str, obj: Obj) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(event_type, obj)
        except Exception:
            log.exception("change handler failed", extra={"kind": self.kind})


def start_all(informers: Iterable[Informer], stop: threading.Event) -> list[threading.Thread]:
    threads = []
    for informer in informers:
        thread = threading.Thread(
            target=informer.run, args=(stop,), name=f"informer-{informer.kind}", daemon=True
        )
        thread.start()
        threads.append(thread)
    return threads
