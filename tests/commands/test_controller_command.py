"""`dra-gpu controller`: flags, environment variables and the messages for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_gpu.cli import build_parser, main


def test_flags_and_their_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_LEADER_ELECT", "false")
    monkeypatch.setenv("DRA_GPU_NAMESPACE", "dra-gpu")
    monkeypatch.setenv("DRA_GPU_HTTP_ADDRESS", "127.0.0.1:9090")
    args = build_parser().parse_args(["controller"])
    assert (args.leader_elect, args.namespace, args.http_address) == (False, "dra-gpu", "127.0.0.1:9090")
    args = build_parser().parse_args(["controller", "--leader-elect", "--namespace", "x"])
    assert (args.leader_elect, args.namespace) == (True, "x")


def test_a_renew_deadline_not_shorter_than_the_lease_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["controller", "--lease-duration", "5", "--renew-deadline", "5"]) == 2
    assert "--renew-deadline must be shorter than --lease-duration" in capsys.readouterr().err


def test_a_bad_http_address_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["controller", "--http-address", "8080"]) == 2
    assert "--http-address '8080': expected HOST:PORT such as :8080" in capsys.readouterr().err


def test_a_missing_kubeconfig_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["controller", "--kubeconfig", str(missing), "--http-address", ""]) == 1
    err = capsys.readouterr().err
    assert f"cannot configure the Kubernetes client from --kubeconfig {missing}" in err


def test_an_environment_value_that_is_not_a_boolean_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRA_GPU_LEADER_ELECT", "maybe")
    with pytest.raises(SystemExit) as raised:
        build_parser()
    assert raised.value.code == 2
    assert "DRA_GPU_LEADER_ELECT='maybe' is invalid" in capsys.readouterr().err
