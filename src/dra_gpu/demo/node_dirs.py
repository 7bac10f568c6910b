"""A demo node's directories (state, CDI, kubelet registration and plugins, device nodes, the toolkit's CDI
specs) under one root, and the node agent's configuration that points at them."""

from __future__ import annotations

from pathlib import Path

from dra_gpu.node_agent import NodeAgentConfig


def node_agent_config(node: str, root: Path, library: Path) -> NodeAgentConfig:
    """Creates the node's directories under `root` and returns the agent's configuration for them."""
    dirs = {name: root / name for name in ("state", "cdi", "registry", "plugins", "dev", "ctk")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    return NodeAgentConfig(
        node_name=node,
        state_dir=dirs["state"],
        cdi_dir=dirs["cdi"],
        registration_dir=dirs["registry"],
        plugins_dir=dirs["plugins"],
        limiter_library=library,
        nvidia_ctk_dirs=(dirs["ctk"],),
        dev_root=dirs["dev"],
    )
