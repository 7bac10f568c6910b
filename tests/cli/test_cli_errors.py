"""What a user sees when a command is given something it cannot use: one line, a distinct exit status.

Exit statuses: 0 done, 1 a check failed or something outside the command failed (NVML, the API),
2 bad input (a flag, a value, a file), 141 the reader of stdout went away (as a shell reports SIGPIPE).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ports import unused_port

from dra_gpu.cli import EXIT_BROKEN_PIPE, main

CLI = [sys.executable, "-m", "dra_gpu.cli"]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DRA_GPU_")}


@pytest.fixture(autouse=True)
def no_flag_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("DRA_GPU_")]:
        monkeypatch.delenv(name)


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`dra-gpu gpus -o json | head -1`: the pipe's reader is gone before the command writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE, as after `head` has exited
    try:
        proc = subprocess.run(
            [*CLI, "gpus", "-o", "json", "--simulate", "8xH100-80GB"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=clean_env(),
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == EXIT_BROKEN_PIPE == 141
    assert proc.stderr == b""


def test_a_reader_that_stops_reading_midway_ends_the_command_quietly() -> None:
    """The real pipeline: `head -c 100` takes the start of the output and exits."""
    proc = subprocess.run(
        f"{sys.executable} -m dra_gpu.cli gpus -o json --simulate 64xH100-80GB | head -c 100 >/dev/null;"
        " echo ${PIPESTATUS[0]}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert proc.stdout.strip() in ("0", "141")  # 0 when head read it all before exiting
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr
    assert proc.stderr == ""


def test_an_empty_simulate_is_refused_not_read_as_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--simulate", ""]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: --simulate needs a profile such as 2xH100-80GB (leave it out for NVML)\n"


def test_a_sharing_entry_naming_no_gpu_of_the_node_is_refused_at_start(tmp_path: Path) -> None:
    env = clean_env()
    env.update(DRA_GPU_NODE_NAME="node-1", DRA_GPU_GPU_BACKEND="simulated:1xH100-80GB")
    for entry, named in (
        ("5=MPS", "5"),
        ("*=Shared,GPU-00000000-0000-0000-0000-000000000000=MPS", "GPU-0000"),
    ):
        proc = subprocess.run(
            [*CLI, "kubelet-plugin", "--sharing", entry, "--state-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1
        assert lines[0].startswith(f"error: --sharing {entry!r}: no GPU {named}")
        assert "its GPUs: 0 (GPU-" in lines[0]


def test_a_sharing_entry_by_index_or_uuid_of_the_node_passes_the_check() -> None:
    from dra_gpu.commands.kubelet_plugin import unknown_sharing_keys
    from dra_gpu.config import NodeSharing
    from dra_gpu.inventory import open_inventory

    inventory = open_inventory("simulated:2xH100-80GB", seed="node-1")
    gpus = inventory.gpus()
    assert unknown_sharing_keys(NodeSharing.parse(f"*=Shared,1=MPS,{gpus[0].uuid}=Exclusive"), gpus) == ""
    assert "no GPU 2 on this node" in unknown_sharing_keys(NodeSharing.parse("2=MPS"), gpus)


def test_the_values_file_backend_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("kubeletPlugin:\n  gpuBackend: simulated:3xFOO\n")
    assert main(["manifests", "--values", str(values)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(
        f"error: {values}: invalid values: kubeletPlugin.gpuBackend: bad GPU profile"
    )
    assert "unknown GPU model 'FOO'" in captured.err

    values.write_text("kubeletPlugin:\n  gpuBackend: simulated:2xH100-80GB,driver=615.71.09\n")
    assert main(["manifests", "--values", str(values)]) == 0


def test_schema_check_says_missing_for_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gpuconfig.schema.json"
    assert main(["schema", "--check", "--path", str(path)]) == 1
    assert capsys.readouterr().err == f"{path} is missing: run `dra-gpu schema --write`\n"
    path.write_text("{}\n")
    assert main(["schema", "--check", "--path", str(path)]) == 1
    assert capsys.readouterr().err == f"{path} is stale: run `dra-gpu schema --write`\n"
    assert main(["schema", "--write", "--path", str(path)]) == 0
    assert main(["schema", "--check", "--path", str(path)]) == 0


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *argv],
        capture_output=True,
        text=True,
        env={**clean_env(), **(env or {})},
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["gpus", "--simulate", "1xH100-80GB"], {"DRA_GPU_OUTPUT": "xml"}, "DRA_GPU_OUTPUT='xml'"),
        (
            ["kubelet-plugin", "--node-name", "n"],
            {"DRA_GPU_MONITOR_INTERVAL": "abc"},
            "DRA_GPU_MONITOR_INTERVAL='abc' is invalid: expected a number",
        ),
        (["kubelet-plugin", "--node-name", "n", "--gpu-backend", "cuda"], {}, "--gpu-backend cuda"),
        (["controller", "--lease-duration", "abc"], {}, "--lease-duration: 'abc' is not a number of seconds"),
        (["controller"], {"DRA_GPU_LEASE_DURATION": "-1"}, "'-1' must be a positive number of seconds"),
    ],
)
def test_every_bad_flag_or_variable_exits_2_with_one_line(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    proc = run_cli(*argv, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert named in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr and "_positive" not in proc.stderr
    assert len([line for line in lines if line.startswith(("error", "dra-gpu"))]) == 1


def parsers() -> dict[str, argparse.ArgumentParser]:
    """`dra-gpu` and each subcommand's parser."""
    from dra_gpu.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"dra-gpu": parser, **sub.choices}


def test_help_shows_each_default_once() -> None:
    for name, parser in parsers().items():
        for action in parser._actions:
            text = action.help % {"default": action.default} if action.help else ""
            assert text.count("(default") <= 1, f"{name} {action.option_strings}: {text}"


def test_yaml_is_offered_wherever_json_is() -> None:
    offering = []
    for name, parser in parsers().items():
        for action in parser._actions:
            if "--output" in action.option_strings and action.choices and "json" in action.choices:
                assert "yaml" in action.choices, name
                offering.append(name)
    assert {"gpus", "usage"} <= set(offering)


def test_gpus_as_yaml_is_the_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import yaml

    assert main(["gpus", "--simulate", "2xH100-80GB", "-o", "yaml"]) == 0
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    assert main(["gpus", "--simulate", "2xH100-80GB", "-o", "json"]) == 0
    assert as_yaml == json.loads(capsys.readouterr().out)


def kubeconfig_for(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return path


def test_a_refused_connection_is_one_line_naming_the_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = unused_port()
    config = kubeconfig_for(tmp_path, f"http://127.0.0.1:{port}")
    assert main(["usage", "--kubeconfig", str(config), "--agents", "none"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"http://127.0.0.1:{port}/apis/resource.k8s.io" in err and "Connection refused" in err
    assert "object at 0x" not in err and "MaxRetryError" not in err and "Pool(" not in err


def test_an_html_error_page_is_one_line_naming_the_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = b"<html><head><title>404</title></head>\n<body><h1>Not Found</h1></body></html>\n"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        config = kubeconfig_for(tmp_path, base)
        assert main(["usage", "--kubeconfig", str(config), "--agents", "none"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"{base}/apis/resource.k8s.io" in err and "HTTP 404 Not Found" in err
        assert "<" not in err

        from dra_gpu.commands.usage import UsageError, fetch_metrics

        with pytest.raises(UsageError) as raised:
            fetch_metrics(f"{base}/metrics")
        assert str(raised.value) == f"{base}/metrics answered HTTP 404 Not Found"
    finally:
        server.shutdown()
        server.server_close()


def test_an_unreachable_metrics_url_is_one_readable_line() -> None:
    from dra_gpu.commands.usage import UsageError, fetch_metrics

    url = f"http://127.0.0.1:{unused_port()}/metrics"
    with pytest.raises(UsageError) as raised:
        fetch_metrics(url)
    assert str(raised.value) == f"cannot reach {url}: Connection refused"
