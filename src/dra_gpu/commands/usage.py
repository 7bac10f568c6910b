"""`dra-gpu usage`: per node and GPU, which claims hold it, with what share, for which pods, using what.

Read-only: it lists ResourceSlices, ResourceClaims (all namespaces) and DeviceClasses. For the use
beside each allocation it reads the node agents' /metrics, through the API server's pod proxy (`list`
pods and `get` pods/proxy in the agents' namespace) or from `--metrics-url`; without them it shows
allocations only.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator

from dra_gpu import DRIVER_NAME
from dra_gpu.commands._exit import fail
from dra_gpu.commands.output import OUTPUTS, dump
from dra_gpu.flags import add_flag, add_kubeconfig_flag, add_list_flag
from dra_gpu.kube import RESOURCES, ApiError, KubeAPI, objects
from dra_gpu.kube.client import KubeClient, KubeConfigError
from dra_gpu.kube.errors import Unreachable, http_problem, transport_reason
from dra_gpu.usage import collect, render_table
from dra_gpu.usage.live import AGENT_NAMESPACE, AGENT_SELECTOR, LiveUsage, fetch_url, read_agents
from dra_gpu.usage.render import to_json

NAME = "usage"
HELP = "show who uses which GPU share, per node: claims, shares, pods, and pending claims"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_kubeconfig_flag(parser)
    add_flag(
        parser,
        "--node",
        env="DRA_GPU_NODE",
        default=None,
        help="show only this node's GPUs (pending claims, which have no node yet, are then left out)",
        unset="every node",
    )
    add_flag(
        parser,
        "--agents",
        default="proxy",
        choices=["proxy", "none"],
        help="read the node agents' /metrics through the API server's pod proxy, or not at all",
    )
    add_flag(parser, "--agent-namespace", default=AGENT_NAMESPACE, help="namespace of the node agents' pods")
    add_list_flag(
        parser,
        "--metrics-url",
        metavar="URL",
        help="read this agent's /metrics directly (repeatable); replaces --agents proxy",
    )
    add_flag(parser, "--output", short="-o", choices=list(OUTPUTS), default="table", help="output format")


class UsageError(Exception):
    """Anything that stops the command from reading the cluster; its message is one line for the user."""


def build_api(args: argparse.Namespace) -> KubeAPI:
    """The API client for `args`; tests replace this function to inject a fake."""
    try:
        return KubeClient.from_kubeconfig(args.kubeconfig)
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        text = exc.message
    elif isinstance(exc, Unreachable):
        text = str(exc)
    else:
        text = transport_reason(exc)
    return " ".join(text.split()) or type(exc).__name__


def fetch_metrics(url: str) -> str:
    """An agent's /metrics from `url`; a failure is one line naming the URL (no repr, no HTML page)."""
    import urllib.error

    try:
        return fetch_url(url)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace") if exc.fp is not None else ""
        raise UsageError(f"{url} answered {http_problem(exc.code, body)}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot reach {url}: {transport_reason(exc)}") from None


def _list(api: KubeAPI, kind: str, field_selector: str | None = None) -> list[dict[str, object]]:
    import urllib3.exceptions

    try:
        items, _ = api.list(kind, field_selector=field_selector)
    except ApiError as exc:
        raise UsageError(f"cannot list {RESOURCES[kind].plural}: {_one_line(exc)}") from None
    except Unreachable as exc:
        raise UsageError(str(exc)) from None
    except (OSError, urllib3.exceptions.HTTPError) as exc:
        raise UsageError(f"cannot reach the Kubernetes API server: {transport_reason(exc)}") from None
    return items


@contextlib.contextmanager
def _quiet_retries() -> Iterator[None]:
    """urllib3 logs a warning per retry; a one-shot command reports the final failure once instead."""
    logger = logging.getLogger("urllib3")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def run_with_api(args: argparse.Namespace, api: KubeAPI) -> int:
    try:
        with _quiet_retries():
            slices = _list(api, "ResourceSlice", f"spec.driver={DRIVER_NAME}")
            claims = _list(api, "ResourceClaim")
            classes = _list(api, "DeviceClass")
    except UsageError as exc:
        return fail(str(exc), 1)
    usage = collect(slices, claims, classes, node=args.node or None)
    live = read_live(args, api)
    if live is not None and live.unreachable:
        agents = ", ".join(f"{a} ({why})" for a, why in sorted(live.unreachable.items()))
        print(f"note: no use shown for the GPUs of unreachable node agents: {agents}", file=sys.stderr)
    if args.output == "table":
        print(render_table(usage, live))
    else:
        print(dump(args.output, to_json(usage, live)), end="")
    return 0


def read_live(args: argparse.Namespace, api: KubeAPI) -> LiveUsage | None:
    """The agents' figures; None when not asked for. Never fails: an unreachable agent is noted."""
    urls = list(getattr(args, "metrics_url", None) or [])
    if urls:
        return read_agents(urls, fetch_metrics)
    if getattr(args, "agents", "none") != "proxy":
        return None
    get_text = getattr(api, "get_text", None)
    namespace = getattr(args, "agent_namespace", AGENT_NAMESPACE)
    if get_text is None:
        return None  # an API without a proxy (the tests' fake): allocations only
    try:
        with _quiet_retries():
            pods, _ = api.list("Pod", namespace=namespace, label_selector=AGENT_SELECTOR)
    except Exception as exc:
        return LiveUsage(unreachable={f"pods in {namespace}": _one_line(exc)})
    agents = {}
    for pod in pods:
        if objects.pod_phase(pod) != "Running":
            continue
        ports = [
            p.get("containerPort")
            for c in objects.pod_containers(pod, ("containers",))
            for p in c.get("ports") or []
            if p.get("name") == "http"
        ]
        if ports:
            name = objects.name(pod)
            agents[f"{namespace}/{name}"] = (
                f"/api/v1/namespaces/{namespace}/pods/{name}:{ports[0]}/proxy/metrics"
            )
    with _quiet_retries():
        return read_agents(agents, lambda agent: str(get_text(agents[agent])))


def run(args: argparse.Namespace) -> int:
    try:
        api = build_api(args)
    except UsageError as exc:
        return fail(str(exc), 1)
    return run_with_api(args, api)
