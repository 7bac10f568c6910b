"""The in-memory API server's answers to TokenReviews and SubjectAccessReviews, as kube-apiserver gives them.

A TokenReview is authenticated when its token is one the test issued (`FakeKube.tokens`: token -> user
info), with that user in `status.user`; any other token is `authenticated: false` with an error, as a
real server answers an unknown or expired token. A SubjectAccessReview for a non-resource URL is allowed
by RBAC alone: a stored ClusterRoleBinding whose subject is the user (a ServiceAccount by its
`system:serviceaccount:<namespace>:<name>` name, a User, or one of its Groups) binds a ClusterRole with a
rule whose `nonResourceURLs` holds the path (or a prefix ending in `*`) and whose `verbs` hold the verb
(or `*`). Resource attributes are not judged here: nothing in the driver asks.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

Obj = dict[str, Any]
REVIEW_KINDS = ("TokenReview", "SubjectAccessReview")


def token_review(review: Obj, tokens: Mapping[str, Obj]) -> Obj:
    answer = copy.deepcopy(review)
    user = tokens.get(str((review.get("spec") or {}).get("token") or ""))
    if user is None:
        answer["status"] = {"authenticated": False, "error": "[invalid bearer token, token lookup failed]"}
    else:
        answer["status"] = {"authenticated": True, "user": copy.deepcopy(dict(user)), "audiences": []}
    return answer


def _subject_matches(subject: Mapping[str, Any], user: str, groups: Iterable[str]) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return user == f"system:serviceaccount:{subject.get('namespace', '')}:{name}"
    if kind == "User":
        return user == name
    return kind == "Group" and name in set(groups)


def _url_matches(pattern: str, path: str) -> bool:
    return pattern == path or (pattern.endswith("*") and path.startswith(pattern[:-1]))


def access_review(review: Obj, roles: Iterable[Obj], bindings: Iterable[Obj]) -> Obj:
    answer = copy.deepcopy(review)
    spec = review.get("spec") or {}
    attributes = spec.get("nonResourceAttributes") or {}
    path, verb = str(attributes.get("path", "")), str(attributes.get("verb", ""))
    user, groups = str(spec.get("user", "")), [str(g) for g in spec.get("groups") or []]
    by_name = {(r.get("metadata") or {}).get("name"): r for r in roles}
    allowed = False
    for binding in bindings:
        if not any(_subject_matches(s, user, groups) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        role = by_name.get(ref.get("name")) if ref.get("kind") == "ClusterRole" else None
        for rule in (role or {}).get("rules") or []:
            if any(_url_matches(str(u), path) for u in rule.get("nonResourceURLs") or []) and (
                verb in (rule.get("verbs") or []) or "*" in (rule.get("verbs") or [])
            ):
                allowed = True
    answer["status"] = {"allowed": allowed} if allowed else {"allowed": False, "reason": ""}
    return answer
