"""Where the client's configuration comes from: kubectl's order, KUBECONFIG's list semantics, errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from http_api_server import ApiServer
from ports import unused_port

from dra_gpu.cli import main
from dra_gpu.kube.kubeconfig import KubeConfigError, choose, merge


def kubeconfig(
    path: Path, server: str, *, cluster: str = "c", context: str | None = "c", current: bool = True
) -> Path:
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": context, "context": {"cluster": cluster, "user": "u"}}] if context else [],
    }
    if current and context:
        config["current-context"] = context
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def server() -> Iterator[ApiServer]:
    s = ApiServer()
    yield s
    s.close()


@pytest.fixture
def no_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A user with no configuration at all: no variables, an empty home, not in a pod."""
    for name in ("KUBECONFIG", "DRA_GPU_KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def server_of(choice_config: dict[str, Any] | None) -> str:
    assert choice_config is not None
    current = choice_config["current-context"]
    context = next(c for c in choice_config["contexts"] if c["name"] == current)["context"]
    return str(
        next(c for c in choice_config["clusters"] if c["name"] == context["cluster"])["cluster"]["server"]
    )


def test_usage_reads_kubeconfig_the_way_kubectl_does(
    server: ApiServer,
    no_config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A KUBECONFIG list whose first file points at the API server: `dra-gpu usage` reads from it."""
    first = kubeconfig(tmp_path / "first", server.url, cluster="shared", context="a")
    # The second file names the same cluster with another server, and another current context: both lose.
    second = kubeconfig(
        tmp_path / "second", f"http://127.0.0.1:{unused_port()}", cluster="shared", context="b"
    )
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{first}:{second}")
    assert main(["usage", "--agents", "none"]) == 0, capsys.readouterr().err
    assert any(r.path.endswith("/resourceslices") for r in server.requests)


def test_home_kubeconfig_is_used_when_kubeconfig_is_unset(
    server: ApiServer, no_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (no_config / ".kube").mkdir()
    kubeconfig(no_config / ".kube" / "config", server.url)
    assert main(["usage", "--agents", "none"]) == 0, capsys.readouterr().err
    assert server.requests


def test_the_explicit_file_wins_over_kubeconfig(tmp_path: Path, no_config: Path) -> None:
    explicit = kubeconfig(tmp_path / "explicit", "http://explicit:1")
    listed = kubeconfig(tmp_path / "listed", "http://listed:1")
    choice = choose(str(explicit), environ={"KUBECONFIG": str(listed)}, home=no_config)
    assert choice.source == f"--kubeconfig {explicit}"
    assert server_of(choice.config) == "http://explicit:1"


def test_kubeconfig_list_first_file_wins_per_entry(tmp_path: Path, no_config: Path) -> None:
    a = kubeconfig(
        tmp_path / "a", "http://a:1", cluster="one", context=None
    )  # no context, no current-context
    b = kubeconfig(tmp_path / "b", "http://b:1", cluster="one", context="ctx-b")
    c = kubeconfig(tmp_path / "c", "http://c:1", cluster="two", context="ctx-c")
    choice = choose(None, environ={"KUBECONFIG": f"{a}:{tmp_path / 'missing'}:{b}:{c}"}, home=no_config)
    assert choice.config is not None
    assert choice.config["current-context"] == "ctx-b"  # the first file that sets one
    assert server_of(choice.config) == "http://a:1"  # cluster "one" as the first file defines it
    assert [c["name"] for c in choice.config["clusters"]] == ["one", "two"]
    assert [c["name"] for c in choice.config["contexts"]] == ["ctx-b", "ctx-c"]


def test_kubeconfig_set_means_home_is_not_read(tmp_path: Path, no_config: Path) -> None:
    (no_config / ".kube").mkdir()
    kubeconfig(no_config / ".kube" / "config", "http://home:1")
    with pytest.raises(KubeConfigError) as err:
        choose(None, environ={"KUBECONFIG": str(tmp_path / "missing")}, home=no_config)
    assert f"KUBECONFIG={tmp_path / 'missing'} (no such file)" in str(err.value)


def test_relative_certificate_paths_are_relative_to_their_file(tmp_path: Path, no_config: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "config"
    kubeconfig(path, "https://x:1")
    data = yaml.safe_load(path.read_text())
    data["clusters"][0]["cluster"]["certificate-authority"] = "ca.crt"
    data["users"][0]["user"]["client-key"] = "/abs/key"
    path.write_text(yaml.safe_dump(data))
    merged = choose(None, environ={"KUBECONFIG": str(path)}, home=no_config).config
    assert merged is not None
    assert merged["clusters"][0]["cluster"]["certificate-authority"] == str(tmp_path / "sub" / "ca.crt")
    assert merged["users"][0]["user"]["client-key"] == "/abs/key"


def test_in_cluster_comes_last(tmp_path: Path, no_config: Path) -> None:
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("t")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    choice = choose(None, environ=env, home=no_config, service_account_dir=account)
    assert choice.config is None and choice.source == "the in-cluster service account"
    (no_config / ".kube").mkdir()
    kubeconfig(no_config / ".kube" / "config", "http://home:1")
    assert choose(None, environ=env, home=no_config, service_account_dir=account).config is not None


def test_nothing_found_names_everything_tried(no_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "error: cannot configure the Kubernetes client: no configuration found; tried "
        f"{no_config / '.kube' / 'config'} (no such file), "
        "in-cluster (KUBERNETES_SERVICE_HOST is not set: not in a pod): pass --kubeconfig or set KUBECONFIG\n"
    )


def test_a_broken_file_is_reported_not_skipped(tmp_path: Path, no_config: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match=f"from {bad}: not valid YAML"):
        choose(None, environ={"KUBECONFIG": str(bad)}, home=no_config)


def test_merge_keeps_preferences_of_the_first_file() -> None:
    merged = merge([{"preferences": {"colors": True}}, {"preferences": {}, "current-context": "x"}])
    assert merged["preferences"] == {"colors": True} and merged["current-context"] == "x"
