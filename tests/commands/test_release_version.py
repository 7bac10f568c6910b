"""One release version, from one source, in every part a user or an admin looks at."""

from __future__ import annotations

import subprocess

from plugin_harness import CLI, PluginDirs, running_plugin
from prometheus_client import generate_latest

from dra_gpu import __version__
from dra_gpu.kube.fake import FakeKube
from dra_gpu.manifests import load_values, render
from dra_gpu.manifests.values import image_reference


def test_the_command_the_image_and_the_manifests_name_one_version() -> None:
    version = subprocess.run([*CLI[:3], "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout == f"dra-gpu {__version__}\n"
    values = load_values(None)
    assert image_reference(values) == f"dra-gpu:{__version__}"
    daemonset = render(values)["kubelet-plugin.yaml"]
    assert f"image: dra-gpu:{__version__}\n" in daemonset
    assert f"libdragpu-limiter.so.{__version__}\n" in daemonset


def test_the_agent_exposes_its_version(dirs: PluginDirs) -> None:
    with running_plugin(dirs, FakeKube()) as agent:
        text = generate_latest(agent.plugin.metrics.registry).decode()
    assert f'dra_gpu_build_info{{version="{__version__}"}} 1.0' in text
