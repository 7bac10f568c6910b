"""The Grafana dashboard of per-claim GPU usage, built from the monitor's metric names.

Rendered into `deploy/grafana-dashboard.yaml` (a ConfigMap labelled for Grafana's dashboard sidecar;
its `dra-gpu.json` key is the dashboard to import by hand elsewhere). Every query names metrics from
`dra_gpu.monitor.metrics.METRICS`, which a test checks. A claim's compute share, floor, ceiling and
priority are its configuration, not series (docs/monitoring.md): the panels show what the claims did,
and `dra-gpu usage` beside them what each was promised.
"""

from __future__ import annotations

import json
from typing import Any

UID = "dra-gpu-usage"
CLAIM = 'namespace=~"$namespace", claim=~"$claim"'


def _panel(
    pid: int,
    title: str,
    targets: list[tuple[str, str]],
    unit: str,
    pos: tuple[int, int, int, int],
    description: str = "",
) -> dict[str, Any]:
    x, y, w, h = pos
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        **({"description": description} if description else {}),
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "definition": query,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
    }


def dashboard() -> dict[str, Any]:
    panels = [
        _panel(
            1,
            "GPU memory per claim: used against limit",
            [
                (
                    f"sum by (namespace, claim, gpu_uuid) (dra_gpu_claim_memory_used_bytes{{{CLAIM}}})",
                    "{{namespace}}/{{claim}} used",
                ),
                (
                    f"sum by (namespace, claim, gpu_uuid) (dra_gpu_claim_memory_limit_bytes{{{CLAIM}}})",
                    "{{namespace}}/{{claim}} limit",
                ),
            ],
            "bytes",
            (0, 0, 12, 8),
        ),
        _panel(
            2,
            "Compute per claim: busy fraction of the GPU",
            [
                (
                    f"sum by (namespace, claim, gpu_uuid) (rate(dra_gpu_claim_compute_busy_seconds_total{{{CLAIM}}}[$__rate_interval]))",
                    "{{namespace}}/{{claim}} busy",
                ),
            ],
            "percentunit",
            (12, 0, 12, 8),
            "GPU time the node measured (NVML). A claim's compute share is its configuration: "
            "dra-gpu usage shows it.",
        ),
        _panel(
            3,
            "GPU memory per namespace",
            [
                (
                    'sum by (namespace) (dra_gpu_claim_memory_used_bytes{namespace=~"$namespace"})',
                    "{{namespace}} used",
                ),
                (
                    'sum by (namespace) (dra_gpu_claim_memory_limit_bytes{namespace=~"$namespace"})',
                    "{{namespace}} limit",
                ),
            ],
            "bytes",
            (0, 8, 12, 8),
        ),
        _panel(
            4,
            "GPU memory per GPU: in use and allocated",
            [
                ("sum by (gpu_uuid) (dra_gpu_claim_memory_used_bytes)", "{{gpu_uuid}} used"),
                ("sum by (gpu_uuid) (dra_gpu_claim_memory_limit_bytes)", "{{gpu_uuid}} allocated"),
            ],
            "bytes",
            (12, 8, 12, 8),
        ),
        _panel(
            5,
            "GPU memory per container",
            [
                (
                    f"sum by (namespace, pod, container) (dra_gpu_container_memory_used_bytes{{{CLAIM}}})",
                    "{{namespace}}/{{pod}}/{{container}}",
                ),
                (  # a claim used by one container has no container series: its own is that container's
                    f"sum by (namespace, claim) (dra_gpu_claim_memory_used_bytes{{{CLAIM}}} unless on "
                    f"(namespace, claim, gpu_uuid) dra_gpu_container_memory_used_bytes)",
                    "{{namespace}}/{{claim}} (one container)",
                ),
            ],
            "bytes",
            (0, 16, 12, 8),
        ),
        _panel(
            6,
            "Throttled time per claim (fraction of wall time)",
            [
                (
                    f"sum by (namespace, claim) (rate(dra_gpu_claim_throttled_seconds_total{{{CLAIM}}}[$__rate_interval]))",
                    "{{namespace}}/{{claim}}",
                ),
            ],
            "percentunit",
            (12, 16, 12, 8),
        ),
        _panel(
            7,
            "Allocations refused per claim",
            [
                (
                    f"sum by (namespace, claim) (increase(dra_gpu_claim_allocations_refused_total{{{CLAIM}}}[$__rate_interval]))",
                    "{{namespace}}/{{claim}}",
                ),
            ],
            "short",
            (0, 24, 12, 8),
        ),
        _panel(
            8,
            "Watchdog: processes escaping their share",
            [
                (
                    f"sum by (namespace, claim, reason) (dra_gpu_watchdog_violating_processes{{{CLAIM}}})",
                    "{{namespace}}/{{claim}} {{reason}}",
                ),
                (
                    f"sum by (namespace, claim, reason) (increase(dra_gpu_watchdog_terminations_total{{{CLAIM}}}[$__rate_interval]))",
                    "{{namespace}}/{{claim}} terminated",
                ),
                (
                    f"sum by (namespace, claim, reason) (increase(dra_gpu_watchdog_violations_total{{{CLAIM}}}[$__rate_interval]))",
                    "{{namespace}}/{{claim}} new {{reason}}",
                ),
            ],
            "short",
            (12, 24, 12, 8),
        ),
        _panel(
            9,
            "Elastic compute per claim: used, borrowed and lent (as the claims report)",
            [
                (
                    f"sum by (namespace, claim, gpu_uuid) (rate(dra_gpu_claim_compute_used_seconds_total{{{CLAIM}}}[$__rate_interval]))",
                    "{{namespace}}/{{claim}} used",
                ),
                (
                    f"sum by (namespace, claim, gpu_uuid) (rate(dra_gpu_claim_compute_borrowed_seconds_total{{{CLAIM}}}[$__rate_interval]))",
                    "{{namespace}}/{{claim}} borrowed",
                ),
                (
                    f"sum by (namespace, claim, gpu_uuid) (rate(dra_gpu_claim_compute_lent_seconds_total{{{CLAIM}}}[$__rate_interval]))",
                    "{{namespace}}/{{claim}} lent",
                ),
            ],
            "percentunit",
            (0, 32, 24, 8),
            "Fractions of the GPU. A claim's series appear once they count (a claim that never borrowed "
            "has no borrowed line). Its floor, ceiling and priority are its configuration: dra-gpu usage "
            "shows them beside these figures.",
        ),
    ]
    return {
        "uid": UID,
        "title": "dra-gpu: GPU usage per claim",
        "tags": ["dra-gpu", "gpu"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "current": {}},
                _variable("namespace", "label_values(dra_gpu_claim_memory_limit_bytes, namespace)"),
                _variable(
                    "claim", 'label_values(dra_gpu_claim_memory_limit_bytes{namespace=~"$namespace"}, claim)'
                ),
            ]
        },
        "panels": panels,
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True)
