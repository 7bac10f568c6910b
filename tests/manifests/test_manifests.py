"""`dra-gpu manifests` renders deploy/ from one values file, and what it renders is what a cluster needs."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from waiting import wait_for

import dra_gpu
from dra_gpu.cli import main
from dra_gpu.config import NodeSharing
from dra_gpu.flags import add_bool_flag
from dra_gpu.host.simulated import SimulatedCommands
from dra_gpu.inventory import open_inventory
from dra_gpu.kube.events import EventRecorder
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.resources import RESOURCES
from dra_gpu.manifests import ValuesError, load_values, render
from dra_gpu.plugin import KubeletPlugin, PluginConfig
from dra_gpu.slices.publisher import SlicePublisher

DEPLOY = Path("deploy")


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def rendered_objects(
    values_text: str | None = None, tmp_path: Path | None = None
) -> dict[str, list[dict[str, Any]]]:
    path = None
    if values_text is not None and tmp_path is not None:
        path = tmp_path / "values.yaml"
        path.write_text(values_text)
    return {name: documents(text) for name, text in render(load_values(path)).items()}


def find(objects: dict[str, list[dict[str, Any]]], kind: str, name: str) -> dict[str, Any]:
    for docs in objects.values():
        for doc in docs:
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name}")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_deploy_is_the_rendered_default() -> None:
    rendered = render(load_values())
    for name, text in rendered.items():
        assert (DEPLOY / name).read_text() == text, f"deploy/{name} is stale: run `dra-gpu manifests --write`"
    assert sorted(p.name for p in DEPLOY.glob("*.yaml")) == sorted(rendered)
    assert main(["manifests", "--check"]) == 0


def test_kustomization_is_what_kustomize_accepts() -> None:
    """What `kubectl kustomize` checks: listed files exist and hold objects with unique ids."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert set(kustomization) <= {"apiVersion", "kind", "resources"}
    ids = []
    for resource in kustomization["resources"]:
        path = DEPLOY / resource
        assert path.is_file(), f"{resource} is listed but missing"
        for doc in documents(path.read_text()):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{resource}: incomplete object"
            assert doc["metadata"].get("name"), f"{resource}: {doc['kind']} without a name"
            group = doc["apiVersion"].rpartition("/")[0]
            ids.append((group, doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]))
    assert len(ids) == len(set(ids)), "duplicate objects"
    assert "controller-classes.yaml" not in kustomization["resources"]


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed (Debian: kubernetes-client)"
)
def test_kubectl_kustomize_builds_deploy() -> None:
    result = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    kinds = {d["kind"] for d in documents(result.stdout)}
    assert {
        "Namespace",
        "DeviceClass",
        "DaemonSet",
        "Deployment",
        "ClusterRole",
        "ValidatingAdmissionPolicy",
    } <= kinds


def granted_by(objects: dict[str, list[dict[str, Any]]], name: str) -> set[tuple[str, str]]:
    role = find(objects, "ClusterRole", name)
    return {(res, verb) for r in role["rules"] for res in r["resources"] for verb in r["verbs"]}


def requests_of(api: FakeKube) -> set[tuple[str, str]]:
    """The (resource, RBAC verb) pairs of the calls the fake API server saw."""
    verbs = {"update_status": ("status", "update")}
    needed = set()
    for call, kind in api.calls:
        plural = RESOURCES[kind].plural
        subresource, verb = verbs.get(call, ("", call))
        needed.add((f"{plural}/{subresource}" if subresource else plural, verb))
    return needed


def test_node_agent_rbac_grants_what_the_agent_calls_and_no_claim_writes() -> None:
    granted = granted_by(rendered_objects(), "dra-gpu-kubelet-plugin")
    api = FakeKube()
    api.create("Node", {"metadata": {"name": "node-1"}})
    api.calls.clear()
    inventory = open_inventory("simulated:8xH100-80GB", seed="node-1")
    SlicePublisher(api, "node-1", inventory, NodeSharing.parse("*=Shared")).sync()
    # A smaller slice size replaces the pool: obsolete slices are deleted, the rest updated.
    SlicePublisher(api, "node-1", inventory, NodeSharing.parse("*=MPS"), devices_per_slice=3).sync()
    publisher = SlicePublisher(api, "node-1", inventory, NodeSharing.parse("*=Shared"), debounce_s=0.01)
    publisher.start()
    wait_for(lambda: ("watch", "ResourceSlice") in api.calls, what="the publisher's watch of ResourceSlices")
    publisher.stop()
    needed = requests_of(api) | {("resourceclaims", "get"), ("resourceclaims", "list")}  # prepare, sweep
    # The usage monitor lists the node's pods; its watchdog writes (and updates repeated) events.
    needed |= {("pods", "list"), ("events", "create"), ("events", "get"), ("events", "update")}
    assert {"create", "update", "delete", "watch"} <= {verb for _, verb in needed}
    assert needed <= granted, f"the node agent calls without permission: {sorted(needed - granted)}"
    # Nothing more: one node must not be able to write claims (status or allocation) of the whole cluster.
    assert not any(res.startswith("resourceclaims") and verb not in ("get", "list") for res, verb in granted)
    assert not any("*" in (res, verb) for res, verb in granted)
    assert not any(res == "secrets" for res, _ in granted)
    assert {verb for res, verb in granted if res.startswith("pods")} == {"list"}, "pods: read only"


def test_controller_rbac_allows_binding_and_leases_only_in_its_namespace() -> None:
    objects = rendered_objects()
    role = find(objects, "ClusterRole", "dra-gpu-controller")
    granted = {(res, verb) for r in role["rules"] for res in r["resources"] for verb in r["verbs"]}
    for needed in [
        ("resourceclaims", "update"),
        ("resourceclaims/status", "patch"),
        ("resourceclaims/binding", "update"),
        ("resourceclaims/binding", "patch"),
        ("deviceclasses", "watch"),
        ("pods", "list"),
        ("events", "create"),
    ]:
        assert needed in granted, needed
    assert not any(res == "leases" for res, _ in granted)
    lease_role = find(objects, "Role", "dra-gpu-controller-leader-election")
    assert lease_role["metadata"]["namespace"] == "dra-gpu"
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]


def test_controller_rbac_lets_its_events_count_repeats() -> None:
    granted = granted_by(rendered_objects(), "dra-gpu-controller")
    api = FakeKube()
    claim = api.create("ResourceClaim", {"metadata": {"name": "c", "namespace": "ns"}, "spec": {}})
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    recorder = EventRecorder(api, "test", lambda: now[0], repeat_after_s=60)
    recorder.record(claim, "Warning", "AllocationFailed", "no GPU has 90 cores left")
    now[0] += timedelta(minutes=5)
    recorder.record(claim, "Warning", "AllocationFailed", "no GPU has 90 cores left")
    (event,) = api.list("Event", namespace="ns")[0]
    assert event["count"] == 2
    needed = requests_of(api) - {("resourceclaims", "create"), ("events", "list")}  # the test's own calls
    assert needed <= granted, f"the controller calls without permission: {sorted(needed - granted)}"


def test_daemonset_runs_on_gpu_nodes_whatever_their_taints() -> None:
    pod = find(rendered_objects(), "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]

    def tolerated(taint: dict[str, str]) -> bool:
        for tol in pod.get("tolerations", []):
            if tol.get("effect") not in (None, "", taint["effect"]):
                continue
            if tol.get("operator") == "Exists" and tol.get("key") in (None, "", taint["key"]):
                return True
            if tol.get("key") == taint["key"] and tol.get("value") == taint.get("value"):
                return True
        return False

    for taint in [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "gpu", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
    ]:
        assert tolerated(taint), taint
    assert pod["priorityClassName"] == "system-node-critical"


def test_nvml_agent_sees_the_host_nvidia_toolkit_cdi_specs(tmp_path: Path) -> None:
    """The agent looks for `nvidia.com/gpu` specs in fixed directories: each must be the host's, read-only."""
    plugin = KubeletPlugin(
        PluginConfig(node_name="n", state_dir=tmp_path / "state", plugins_dir=tmp_path / "plugins"),
        FakeKube(),
        open_inventory("simulated:1xH100-80GB", seed="n"),
        SimulatedCommands(),
    )
    looked_in = {str(d) for d in plugin.node.nvidia_ctk_dirs if d != plugin.config.cdi_dir}
    assert looked_in == {"/etc/cdi"}
    pod = find(rendered_objects(), "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for directory in looked_in:
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
        assert mount.get("readOnly") is True
        assert volumes[mount["name"]]["hostPath"]["path"] == directory


def test_daemonset_passes_the_node_agent_its_settings() -> None:
    daemonset = find(rendered_objects(), "DaemonSet", "dra-gpu-kubelet-plugin")
    pod = daemonset["spec"]["template"]["spec"]
    (plugin,) = pod["containers"]
    assert plugin["command"] == ["dra-gpu", "kubelet-plugin"]
    env = env_of(plugin)
    assert env["DRA_GPU_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["DRA_GPU_DRIVER_NAME"] == "gpu.dra-gpu.io"
    assert env["DRA_GPU_REGISTRATION_DIR"] == "/var/lib/kubelet/plugins_registry"
    assert env["DRA_GPU_PLUGINS_DIR"] == "/var/lib/kubelet/plugins"
    assert env["DRA_GPU_CDI_DIR"] == "/var/run/cdi"
    assert env["DRA_GPU_STATE_DIR"] == "/var/lib/dra-gpu"
    assert env["DRA_GPU_GPU_BACKEND"] == "nvml"
    assert env["DRA_GPU_SHARING"] == "*=Shared"
    assert env["DRA_GPU_MIG_DYNAMIC"] == "false"
    assert (
        env["DRA_GPU_LIMITER_LIBRARY"] == f"/var/lib/dra-gpu/lib/libdragpu-limiter.so.{dra_gpu.__version__}"
    )
    assert env["DRA_GPU_HTTP_ADDRESS"] == ":8080"
    assert env["DRA_GPU_LOG_FORMAT"] == "json"
    mounts = {m["mountPath"] for m in plugin["volumeMounts"]}
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/run/cdi",
        "/var/lib/dra-gpu",
    } <= (mounts & host_paths)
    (init,) = pod["initContainers"]
    script = init["command"][-1]
    assert "/usr/lib/dra-gpu/libdragpu-limiter.so.1" in script
    assert script.rstrip().endswith(f"/var/lib/dra-gpu/lib/libdragpu-limiter.so.{dra_gpu.__version__}")
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in init["securityContext"]
    # the nvml backend drives real GPUs
    assert plugin["securityContext"] == {"privileged": True, "runAsUser": 0}


def test_the_image_holds_what_the_daemonset_runs() -> None:
    """No Docker here: the final stage of the Dockerfile must carry the file and the tools the pods use."""
    final = Path("Dockerfile").read_text().rpartition("\nFROM ")[2]
    pod = find(rendered_objects(), "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    script = pod["initContainers"][0]["command"][-1]
    copied = [line.split()[-1] for line in final.splitlines() if line.startswith("COPY --from=limiter")]
    assert copied and all(path in script for path in copied)
    checked = [line for line in final.splitlines() if "command -v" in line or line.startswith("RUN for tool")]
    for tool in ("unshare", "mount", "sh", "cp", "mv"):  # MPS namespaces; the init container's script
        assert any(f" {tool}" in line for line in checked), f"the image build does not check for {tool}"


def schedulable_on(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a node with `labels` passes the pod's node selector and required node affinity."""
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True

    def holds(e: dict[str, Any]) -> bool:
        return e["key"] in labels if e["operator"] == "Exists" else labels.get(e["key"]) in e["values"]

    return any(all(holds(e) for e in term["matchExpressions"]) for term in required["nodeSelectorTerms"])


def test_daemonset_runs_only_on_gpu_nodes(tmp_path: Path) -> None:
    pod = find(rendered_objects(), "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    assert schedulable_on(pod, {"feature.node.kubernetes.io/pci-10de.present": "true"}), "NFD's label"
    assert schedulable_on(pod, {"nvidia.com/gpu.present": "true"}), "the GPU operator's label"
    assert not schedulable_on(pod, {"kubernetes.io/os": "linux"}), "a node without a GPU"

    own = rendered_objects("kubeletPlugin:\n  gpuNodeLabels: [example.com/gpu]\n", tmp_path)
    pod = find(own, "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    assert schedulable_on(pod, {"example.com/gpu": "a100"})
    assert not schedulable_on(pod, {"nvidia.com/gpu.present": "true"})

    everywhere = rendered_objects("kubeletPlugin:\n  gpuNodeLabels: []\n", tmp_path)
    pod = find(everywhere, "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    assert schedulable_on(pod, {})

    simulated = rendered_objects("kubeletPlugin:\n  gpuBackend: simulated:2xH100-80GB\n", tmp_path)
    pod = find(simulated, "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    assert schedulable_on(pod, {}), "simulated GPUs need no GPU node"


def test_the_dashboard_lands_where_grafanas_sidecar_looks(tmp_path: Path) -> None:
    default = find(rendered_objects(), "ConfigMap", "dra-gpu-grafana-dashboard")["metadata"]
    assert default["namespace"] == "dra-gpu" and default["labels"]["grafana_dashboard"] == "1"
    values = (
        "grafanaDashboard: {namespace: monitoring, label: grafana_dashboard_x, labelValue: 'yes', "
        "folder: GPUs, folderAnnotation: grafana_folder}\n"
    )
    meta = find(rendered_objects(values, tmp_path), "ConfigMap", "dra-gpu-grafana-dashboard")["metadata"]
    assert meta["namespace"] == "monitoring"
    assert meta["labels"]["grafana_dashboard_x"] == "yes"
    assert meta["annotations"] == {"grafana_folder": "GPUs"}


def test_simulated_nodes_run_without_privileges(tmp_path: Path) -> None:
    objects = rendered_objects("kubeletPlugin:\n  gpuBackend: simulated:2xH100-80GB\n", tmp_path)
    pod = find(objects, "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    (plugin,) = pod["containers"]
    assert env_of(plugin)["DRA_GPU_GPU_BACKEND"] == "simulated:2xH100-80GB"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(plugin)
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert plugin["securityContext"].get("privileged") is not True


def test_dynamic_mig_is_turned_on_for_the_agent_by_one_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kubeletPlugin.migDynamic: true` reaches the agent as the variable its `--mig-dynamic` flag reads."""
    daemonset = find(
        rendered_objects("kubeletPlugin:\n  migDynamic: true\n", tmp_path),
        "DaemonSet",
        "dra-gpu-kubelet-plugin",
    )
    (plugin,) = daemonset["spec"]["template"]["spec"]["containers"]
    value = env_of(plugin)["DRA_GPU_MIG_DYNAMIC"]
    monkeypatch.setenv("DRA_GPU_MIG_DYNAMIC", value)
    parser = argparse.ArgumentParser()
    add_bool_flag(parser, "--mig-dynamic")
    assert parser.parse_args([]).mig_dynamic is True


def test_the_e2e_kind_values_render_an_unprivileged_simulated_agent() -> None:
    objects = {
        name: documents(text) for name, text in render(load_values(Path("e2e/values-kind.yaml"))).items()
    }
    (plugin,) = find(objects, "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]["containers"]
    assert env_of(plugin)["DRA_GPU_GPU_BACKEND"].startswith("simulated:")
    assert plugin["imagePullPolicy"] == "Never"
    assert plugin["securityContext"].get("privileged") is not True


def test_values_move_kubelet_paths_and_the_image(tmp_path: Path) -> None:
    objects = rendered_objects(
        "image: {repository: example.org/dra-gpu, tag: dev}\nkubeletPlugin: {kubeletDir: /var/lib/k0s/kubelet/}\n",
        tmp_path,
    )
    pod = find(objects, "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "example.org/dra-gpu:dev"
    assert env_of(pod["containers"][0])["DRA_GPU_REGISTRATION_DIR"] == "/var/lib/k0s/kubelet/plugins_registry"


def test_disabling_the_controller_drops_its_files_from_the_kustomization(tmp_path: Path) -> None:
    objects = rendered_objects(
        "controller: {enabled: false}\nvalidatingAdmissionPolicy: {enabled: false}\n", tmp_path
    )
    assert "controller.yaml" not in objects and "rbac-controller.yaml" not in objects
    assert "controller-classes.yaml" not in objects and "validatingadmissionpolicy.yaml" not in objects
    (kustomization,) = objects["kustomization.yaml"]
    assert kustomization["resources"] == [
        "namespace.yaml",
        "resourceclass.yaml",
        "rbac-kubelet-plugin.yaml",
        "kubelet-plugin.yaml",
        "networkpolicy.yaml",
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("kubeletPlugin:\n  sharng: '*=MPS'\n", "kubeletPlugin.sharng: unknown key"),
        (
            "kubeletPlugin:\n  sharing: '*=Fast'\n",
            "kubeletPlugin.sharing: --sharing: '*=Fast': unknown mode 'Fast'",
        ),
        ("kubeletPlugin:\n  gpuBackend: cuda\n", "kubeletPlugin.gpuBackend: String should match pattern"),
        (
            "controller:\n  classes:\n  - {name: x.io, strategy: Fast, placement: {}}\n",
            "controller.classes.0.strategy",
        ),
        ("controller:\n  leaderElect: false\n", "controller: replicas: 2 replicas need leaderElect: true"),
        ("- a list\n", "expected a mapping of values, got list"),
        ("image: [\n", "not valid YAML"),
    ],
)
def test_bad_values_name_the_problem(tmp_path: Path, values: str, message: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(values)
    with pytest.raises(ValuesError) as info:
        load_values(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_unknown_class_in_extended_resource_names_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text("deviceClasses:\n  extendedResourceNames: {big.gpu.dra-gpu.io: dra-gpu.io/gpu}\n")
    with pytest.raises(ValuesError, match=r"unknown class 'big.gpu.dra-gpu.io'"):
        render(load_values(path))
    path.write_text("deviceClasses:\n  extendedResourceNames: {gpu.dra-gpu.io: dra-gpu.io/gpu}\n")
    whole = find(
        {"r": documents(render(load_values(path))["resourceclass.yaml"])}, "DeviceClass", "gpu.dra-gpu.io"
    )
    assert whole["spec"]["extendedResourceName"] == "dra-gpu.io/gpu"


def test_cli_writes_checks_and_prunes_only_its_own_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deploy"
    out.mkdir()
    (out / "mine.yaml").write_text("kind: ConfigMap\n")
    (out / "old.yaml").write_text(render(load_values())["namespace.yaml"])  # generated earlier, now gone
    assert main(["manifests", "--dir", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{out}/kubelet-plugin.yaml is missing" in err
    assert f"{out}/old.yaml is no longer generated" in err
    assert f"run `dra-gpu manifests --dir {out} --write`" in err
    assert main(["manifests", "--dir", str(out), "--write"]) == 0
    assert main(["manifests", "--dir", str(out), "--check"]) == 0
    assert (out / "mine.yaml").exists() and not (out / "old.yaml").exists()
    (out / "controller.yaml").write_text("edited\n")
    assert main(["manifests", "--dir", str(out), "--check"]) == 1
    assert f"{out}/controller.yaml differs" in capsys.readouterr().err


def test_cli_prints_an_installable_stream_and_reports_bad_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["manifests"]) == 0
    kinds = [d["kind"] for d in documents(capsys.readouterr().out)]
    assert "Kustomization" not in kinds and "DaemonSet" in kinds and kinds.count("DeviceClass") == 6
    bad = tmp_path / "v.yaml"
    bad.write_text("namespace: Not_A_Namespace\n")
    assert main(["manifests", "--values", str(bad)]) == 2
    assert f"error: {bad}: invalid values: namespace: String should match pattern" in capsys.readouterr().err


def test_the_image_reference_comes_from_the_values_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make image` builds what the manifests run: both read image.repository and image.tag."""
    from dra_gpu import __version__

    assert main(["manifests", "--image"]) == 0
    assert capsys.readouterr().out == f"dra-gpu:{__version__}\n"
    text = "image: {repository: registry.internal/dra-gpu, tag: '1.2', pullPolicy: Always}\n"
    values = tmp_path / "values.yaml"
    values.write_text(text)
    assert main(["manifests", "--values", str(values), "--image"]) == 0
    assert capsys.readouterr().out == "registry.internal/dra-gpu:1.2\n"
    pod = find(rendered_objects(text, tmp_path), "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]
    containers = pod["spec"]["initContainers"] + pod["spec"]["containers"]
    assert {(c["image"], c["imagePullPolicy"]) for c in containers} == {
        ("registry.internal/dra-gpu:1.2", "Always")
    }


def test_the_readme_says_how_the_daemonset_reaches_the_driver() -> None:
    """The README once said the toolkit injects NVML; the DaemonSet mounts the driver root's usr/ instead."""
    readme = Path("README.md").read_text()
    pod = find(rendered_objects(), "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    (plugin,) = pod["containers"]
    env = env_of(plugin)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and "`NVIDIA_VISIBLE_DEVICES=void`" in readme
    mount = next(m for m in plugin["volumeMounts"] if m["mountPath"] == env["DRA_GPU_DRIVER_ROOT"] + "/usr")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/usr" and f"`/usr` read-only at `{mount['mountPath']}`" in readme
    assert "toolkit injects" not in readme
    for label in load_values().kubeletPlugin.gpuNodeLabels:
        assert f"`{label}`" in readme, label
