"""`dra-gpu usage`: per node and GPU, which claims hold it, with what share, for which pods.

Read-only: it lists ResourceSlices, ResourceClaims (all namespaces) and DeviceClasses, so it needs
`list` on those three and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator

from dra_gpu import DRIVER_NAME
from dra_gpu.flags import add_flag
from dra_gpu.kube import RESOURCES, ApiError, KubeAPI
from dra_gpu.usage import collect, render_json, render_table

NAME = "usage"
HELP = "show who uses which GPU share, per node: claims, shares, pods, and pending claims"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flag(
        parser,
        "--kubeconfig",
        env="DRA_GPU_KUBECONFIG",
        default=None,
        help="kubeconfig file; in-cluster configuration when unset",
    )
    add_flag(
        parser,
        "--node",
        env="DRA_GPU_NODE",
        default=None,
        help="show only this node's GPUs (pending claims, which have no node yet, are then left out)",
    )
    parser.add_argument(
        "-o", "--output", choices=["table", "json"], default="table", help="output format (default: table)"
    )


class UsageError(Exception):
    """Anything that stops the command from reading the cluster; its message is one line for the user."""


def build_api(args: argparse.Namespace) -> KubeAPI:
    """The API client for `args`; tests replace this function to inject a fake."""
    from dra_gpu.kube.client import KubeClient, KubeConfigError

    try:
        return KubeClient.from_kubeconfig(args.kubeconfig)
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "reason", None) or exc) if not isinstance(exc, ApiError) else exc.message
    return " ".join(text.split()) or type(exc).__name__


def _list(api: KubeAPI, kind: str, field_selector: str | None = None) -> list[dict[str, object]]:
    import urllib3.exceptions

    try:
        items, _ = api.list(kind, field_selector=field_selector)
    except ApiError as exc:
        raise UsageError(f"cannot list {RESOURCES[kind].plural}: {_one_line(exc)}") from None
    except (OSError, urllib3.exceptions.HTTPError) as exc:
        raise UsageError(f"cannot reach the Kubernetes API server: {_one_line(exc)}") from None
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
        print(f"error: {exc}", file=sys.stderr)
        return 1
    usage = collect(slices, claims, classes, node=args.node or None)
    print(render_json(usage) if args.output == "json" else render_table(usage))
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        api = build_api(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return run_with_api(args, api)
