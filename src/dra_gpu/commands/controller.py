"""`dra-gpu controller`: the cluster controller that allocates claims of controller-managed classes.

Runs as a Deployment (two replicas with `--leader-elect`); see `docs/controller.md`.
"""

from __future__ import annotations

import argparse
import logging
import socket

from dra_gpu.commands._exit import fail
from dra_gpu.commands._process import wait_for_signal
from dra_gpu.controller import Controller
from dra_gpu.flags import add_bool_flag, add_flag, add_kubeconfig_flag, add_metrics_auth_flag
from dra_gpu.http_endpoint import HttpServer, bool_check, parse_address
from dra_gpu.kube.client import KubeClient, KubeConfigError
from dra_gpu.kube.reviews import PathAccess

NAME = "controller"
HELP = "run the cluster controller that allocates claims of controller-managed DeviceClasses"

log = logging.getLogger(__name__)


def _positive(text: str) -> float:
    """A number of seconds above 0; its error is the message argparse shows (not this function's name)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_kubeconfig_flag(parser)
    add_bool_flag(
        parser,
        "--leader-elect",
        env="DRA_GPU_LEADER_ELECT",
        default=True,
        help="hold a Lease so that only one replica allocates",
    )
    add_flag(parser, "--namespace", default="default", help="namespace of the leader-election Lease")
    add_flag(parser, "--lease-name", default="dra-gpu-controller", help="name of the leader-election Lease")
    add_flag(
        parser,
        "--identity",
        default=socket.gethostname(),
        help="this replica's name in the Lease (the pod name in a Deployment)",
    )
    add_flag(
        parser, "--lease-duration", default=15.0, type=_positive, help="seconds before a lease is taken over"
    )
    add_flag(
        parser,
        "--renew-deadline",
        default=10.0,
        type=_positive,
        help="seconds a leader keeps trying to renew",
    )
    add_flag(parser, "--retry-period", default=2.0, type=_positive, help="seconds between lease attempts")
    add_flag(parser, "--resync-period", default=30.0, type=_positive, help="seconds between full passes")
    add_flag(
        parser,
        "--http-address",
        default=":8080",
        help="address for /metrics, /healthz and /readyz; empty to disable",
        unset="off",
    )
    add_metrics_auth_flag(parser)


def run(args: argparse.Namespace) -> int:
    if args.leader_elect and not args.renew_deadline < args.lease_duration:
        return fail("--renew-deadline must be shorter than --lease-duration")
    if args.http_address:
        try:
            parse_address(args.http_address)
        except ValueError as exc:
            return fail(str(exc))
    try:
        api = KubeClient.from_kubeconfig(args.kubeconfig)
    except KubeConfigError as exc:
        return fail(str(exc), 1)
    controller = Controller(
        api,
        identity=args.identity,
        namespace=args.namespace,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease_duration_s=args.lease_duration,
        renew_deadline_s=args.renew_deadline,
        retry_period_s=args.retry_period,
        resync_s=args.resync_period,
    )
    server = None
    if args.http_address:
        try:
            server = HttpServer(
                args.http_address,
                controller.metrics.registry,
                {"/healthz": bool_check(controller.healthy), "/readyz": controller.readiness},
                name="controller-http",
                authorize=PathAccess(api).check if args.metrics_auth else None,
            )
        except OSError as exc:
            return fail(f"--http-address {args.http_address}: {exc.strerror or exc}")
    # urllib3 logs every retry of every call; the controller says once that the API server is down.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    controller.start()
    if server is not None:
        server.start()
    log.info(
        "controller started",
        extra={"identity": args.identity, "leader_elect": args.leader_elect, "http": args.http_address},
    )
    wait_for_signal()
    if server is not None:
        server.stop()
    controller.stop()
    return 0
