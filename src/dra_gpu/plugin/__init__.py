"""The kubelet plugin (node agent): registration, DRA v1 and health services, prepare/unprepare, sharing."""

from dra_gpu.plugin.server import DEFAULT_LIMITER_LIBRARY, KubeletPlugin, PluginConfig

__all__ = ["DEFAULT_LIMITER_LIBRARY", "KubeletPlugin", "PluginConfig"]
