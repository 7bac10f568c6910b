"""What every check gets: the GPU, the built programs, the limiter, and environments to run them in."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpucheck.gpu import Gpu

GIB = 1024**3
MIB = 1024**2


@dataclass
class Context:
    root: Path
    """The source tree."""
    build: Path
    out: Path
    gpu: Gpu
    programs: dict[str, Path] = field(default_factory=dict)
    build_errors: dict[str, str] = field(default_factory=dict)
    limiter: Path | None = None
    limiter_error: str = ""
    python: str = "python3"
    framework_python: str = ""
    """The Python with the frameworks the workloads use (GPU_CHECK_FRAMEWORK_PYTHON); empty: `python`."""
    pythonpath: list[Path] = field(default_factory=list)
    """Where the project (src) and its bundled dependencies are, for Python subprocesses."""
    quick: bool = False
    """Shorter measurement windows (GPU_CHECK_QUICK=1), for trying the suite out."""
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu-check-")))

    @property
    def workload_python(self) -> str:
        """The Python that runs framework workloads (PyTorch, CuPy, JAX)."""
        return self.framework_python or self.python

    def program(self, name: str) -> Path | None:
        return self.programs.get(name)

    def missing(self, *names: str) -> str:
        """Why a check cannot run for lack of a program or the limiter; empty when it can."""
        for name in names:
            if name == "limiter":
                if self.limiter is None:
                    return self.limiter_error or "the limiter is not built"
            elif name not in self.programs:
                return f"{name}: {self.build_errors.get(name, 'not built')}"
        return ""

    def base_env(self) -> dict[str, str]:
        """The caller's environment with only the checked GPU visible, and nothing of the limiter."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DRAGPU_", "CUDA_MPS_")) and k not in ("LD_PRELOAD", "CUDA_VISIBLE_DEVICES")
        }
        env["CUDA_VISIBLE_DEVICES"] = self.gpu.uuid
        return env

    def project_env(self) -> dict[str, str]:
        """`base_env` for a Python process that imports the project (and its bundled dependencies).

        Workloads (PyTorch) do not get them, so that they run with the node's own packages.
        """
        env = self.base_env()
        env["PYTHONPATH"] = os.pathsep.join(
            str(p) for p in [*self.pythonpath, *env.get("PYTHONPATH", "").split(os.pathsep)] if str(p)
        )
        return env

    def state_dir(self, name: str) -> Path:
        """A fresh claim state directory (one region file per claim)."""
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.work))
        path.chmod(0o777)
        return path

    def limiter_env(
        self, memory: int | None = None, cores: int | None = None, state_dir: Path | None = None
    ) -> dict[str, str]:
        """The limiter's environment contract, as the kubelet plugin writes it (limits by UUID)."""
        if self.limiter is None:
            raise RuntimeError("the limiter is not built")
        env = self.base_env()
        env["LD_PRELOAD"] = str(self.limiter)
        if state_dir is not None:
            env["DRAGPU_LIMITER_STATE_DIR"] = str(state_dir)
        if memory is not None:
            env["DRAGPU_MEMORY_LIMIT_BY_UUID"] = f"{self.gpu.uuid}={memory}"
        if cores is not None:
            env["DRAGPU_CORES_LIMIT"] = str(cores)
        return env
