"""Events on claims: where `kubectl describe resourceclaim` shows users why a claim is still pending.

The scheduler only ever says "cannot allocate all claims"; the controller's AllocationFailed event says
which capacity, constraint or node filter ran out. A repeated message updates the existing event's
count (at most once per `repeat_after_s`) instead of piling up new objects, as client-go's event
correlator does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from dra_gpu.kube import ApiError, KubeAPI

Obj = dict[str, Any]
log = logging.getLogger(__name__)

COMPONENT = "dra-gpu-controller"
MAX_MESSAGE = 1024  # the API server caps event messages at 1 KiB


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Writes core/v1 Events; failures are logged, never raised (an event is not worth a retry loop)."""

    def __init__(
        self,
        api: KubeAPI,
        instance: str,
        clock: Callable[[], datetime],
        repeat_after_s: float = 300.0,
        component: str = COMPONENT,
        max_remembered: int = 4096,
    ) -> None:
        self._api = api
        self._component = component
        self._repeat_after_s = repeat_after_s
        self._instance = instance
        self._clock = clock
        self._last: dict[tuple[str, str], tuple[str, Obj]] = {}  # (claim uid, reason) -> (message, event)
        self._max_remembered = max_remembered
        """Events remembered for folding repeats, the least recently recorded forgotten first: one
        object's repeats are minutes apart, and every object ever reported must not stay in memory."""

    def record(self, obj: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        uid, namespace = meta.get("uid", ""), meta.get("namespace") or "default"
        message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
        when = self._clock()
        now = timestamp(when)
        previous = self._last.get((uid, reason))
        stored: Obj | None = None
        if previous and previous[0] == message:
            last = datetime.strptime(previous[1].get("lastTimestamp", now), "%Y-%m-%dT%H:%M:%SZ")
            if (when.replace(tzinfo=None) - last).total_seconds() < self._repeat_after_s:
                return  # passes run on every change: one line per message and interval is enough
            try:
                event = self._api.get("Event", previous[1]["metadata"]["name"], namespace)
                event["count"] = int(event.get("count") or 1) + 1
                event["lastTimestamp"] = now
                stored = self._api.update("Event", event)
            except ApiError:
                stored = None  # expired or changed: start a new event
        if stored is None:
            try:
                stored = self._api.create("Event", self._new(obj, event_type, reason, message, now))
            except ApiError as exc:
                log.warning("could not record event", extra={"reason": reason, "error": str(exc)})
                return
        self._last.pop((uid, reason), None)
        self._last[(uid, reason)] = (message, stored)
        while len(self._last) > self._max_remembered:
            del self._last[next(iter(self._last))]

    def retain(self, uids: set[str]) -> None:
        """Drop the correlation state of objects that are gone."""
        for key in [k for k in self._last if k[0] not in uids]:
            del self._last[key]

    def _new(self, obj: Mapping[str, Any], event_type: str, reason: str, message: str, now: str) -> Obj:
        meta = obj.get("metadata") or {}
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{meta.get('name', 'object')}.",
                "namespace": meta.get("namespace") or "default",  # a cluster-scoped object's go to default
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "resource.k8s.io/v1"),
                "kind": obj.get("kind", "ResourceClaim"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": event_type,
            "reason": reason,
            "message": message,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
