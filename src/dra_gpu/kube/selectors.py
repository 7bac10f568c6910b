"""Field and label selector matching with the API server's equality syntax (`a=b`, `a==b`, `a!=b`)."""

from __future__ import annotations

from typing import Any

from dra_gpu.kube import objects


def _lookup(obj: dict[str, Any], dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return ""
        value = value.get(part)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _terms(selector: str | None) -> list[tuple[str, str, bool]]:
    terms = []
    for raw in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append((key.strip(), value.strip(), False))
        else:
            key, _, value = raw.replace("==", "=").partition("=")
            terms.append((key.strip(), value.strip(), True))
    return terms


def field_matches(obj: dict[str, Any], selector: str | None) -> bool:
    return all((_lookup(obj, k) == v) == eq for k, v, eq in _terms(selector))


def label_matches(obj: dict[str, Any], selector: str | None) -> bool:
    labels = objects.labels(obj)
    return all((labels.get(k, "") == v) == eq for k, v, eq in _terms(selector))
