"""Who may read a path of our HTTP endpoint: the API server's answer, as the kubelet and kube-rbac-proxy ask it.

A request's bearer token goes to a TokenReview (authentication.k8s.io/v1); the user it names goes to a
SubjectAccessReview (authorization.k8s.io/v1) for a non-resource URL (`get /metrics`), which RBAC answers
from a `nonResourceURLs` rule. So a ClusterRole bound to Prometheus's ServiceAccount is all it takes to
scrape, and a pod without such a binding reads nothing. Answers are cached briefly (by a hash of the token,
never the token itself), so a scrape every few seconds costs two API calls a minute, and a token revoked
or a binding removed stops working within `allowed_ttl_s`. An API server that cannot be asked is a 503,
never a pass.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from dra_gpu.kube.api import KubeAPI
from dra_gpu.kube.errors import ApiError


class Verdict(NamedTuple):
    """An HTTP status (200 allowed, 401 no or a bad token, 403 not allowed, 503 cannot tell) and why."""

    status: int
    message: str


NO_TOKEN = Verdict(401, "send a bearer token: Authorization: Bearer <token>")


class PathAccess:
    """Whether a request's `Authorization` header lets its sender `verb` the non-resource `path`."""

    def __init__(
        self,
        api: KubeAPI,
        path: str = "/metrics",
        verb: str = "get",
        *,
        allowed_ttl_s: float = 60.0,
        denied_ttl_s: float = 10.0,
        max_entries: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._path = path
        self._verb = verb
        self._ttl = {True: allowed_ttl_s, False: denied_ttl_s}
        self._max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()

    def check(self, authorization: str | None) -> Verdict:
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return NO_TOKEN
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        try:
            verdict = self._review(token)
        except (ApiError, OSError) as exc:  # OSError: the server is unreachable
            return Verdict(503, f"cannot check the token with the API server now: {exc}")
        with self._lock:
            self._cache.pop(key, None)
            self._cache[key] = (now + self._ttl[verdict.status == 200], verdict)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return verdict

    def _review(self, token: str) -> Verdict:
        review = self._api.create(
            "TokenReview",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Verdict(401, "the token is not valid")
        user = status.get("user") or {}
        access = self._api.create(
            "SubjectAccessReview",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.get("username", ""),
                    "uid": user.get("uid", ""),
                    "groups": list(user.get("groups") or []),
                    "extra": dict(user.get("extra") or {}),
                    "nonResourceAttributes": {"path": self._path, "verb": self._verb},
                },
            },
        )
        if (access.get("status") or {}).get("allowed"):
            return Verdict(200, "ok")
        return Verdict(
            403,
            f"{user.get('username', 'the user')} may not {self._verb} {self._path} (an RBAC nonResourceURLs rule)",
        )
