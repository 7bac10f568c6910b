"""dra-gpu: a Kubernetes DRA driver for sharing NVIDIA GPUs."""

DRIVER_NAME = "gpu.dra-gpu.io"
"""The DRA driver name; also the domain of every attribute and capacity we publish."""

CONFIG_API_VERSION = "gpu.dra-gpu.io/v1alpha1"
CONFIG_KIND = "GpuConfig"

CONTROLLER_FINALIZER = "gpu.dra-gpu.io/allocation"
"""Our finalizer on claims the cluster controller allocated (Kubernetes only releases its own)."""

SCHEDULER_FINALIZER = "resource.kubernetes.io/delete-protection"
"""The finalizer Kubernetes puts on claims it allocated; reserved for Kubernetes itself."""

__version__ = "0.2.0"
