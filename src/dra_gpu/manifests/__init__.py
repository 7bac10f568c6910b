"""The install manifests (`deploy/`), rendered from jinja2 templates and one values file.

Templates and the default values live in `dra_gpu/templates/manifests/` so that an installed
`dra-gpu manifests` finds them; the DeviceClasses are built from the driver's own config models.
"""

from dra_gpu.manifests.render import INSTALLED, ManifestError, files_for, install_stream, render
from dra_gpu.manifests.values import Values, ValuesError, image_reference, load_values

__all__ = [
    "INSTALLED",
    "ManifestError",
    "Values",
    "ValuesError",
    "files_for",
    "image_reference",
    "install_stream",
    "load_values",
    "render",
]
