"""Building what the checks run: the CUDA programs (with nvcc) and the limiter (its own make target).

The programs are rebuilt only when a source is newer than the binary. The driver-API program links
with `-lcuda` against a stub library generated here from the symbols it uses (the toolkit's stubs
are not always installed); at run time the loader finds the driver's real `libcuda.so.1`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gpucheck.proc import Ran, run, which

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "cuda"

# SASS for Ampere and Hopper, PTX that newer GPUs compile at load time.
GENCODE = (
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_75,code=compute_75",
)


@dataclass(frozen=True)
class Program:
    name: str
    source: str
    flags: tuple[str, ...]
    strict: tuple[str, ...]
    """Warnings as errors. A toolkit or compiler newer than the one the programs were written with
    may warn where this one does not: the program is then built without them, and the build says so."""
    driver_api: bool = False
    """Linked with -lcuda (against the generated stub)."""


PROGRAMS = (
    Program("gc_drv", "gc_drv.c", ("-O2",), ("-Xcompiler=-Wall,-Wextra,-Werror",), driver_api=True),
    Program("gc_rt_shared", "gc_rt.cu", ("-O2", *GENCODE, "-cudart=shared"), ("-Werror=all-warnings",)),
    Program("gc_rt_static", "gc_rt.cu", ("-O2", *GENCODE, "-cudart=static"), ("-Werror=all-warnings",)),
)


@dataclass
class Built:
    programs: dict[str, Path] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    lenient: dict[str, str] = field(default_factory=dict)
    """Programs built only without warnings as errors, and what the strict build said."""
    nvcc: str | None = None
    log: list[str] = field(default_factory=list)


def _newer(target: Path, sources: list[Path]) -> bool:
    return target.is_file() and all(target.stat().st_mtime >= s.stat().st_mtime for s in sources)


def _library_dirs(nvcc: str) -> list[str]:
    """The toolkit's library directories, as nvcc itself reports them (for the runtime's rpath)."""
    ran = run([nvcc, "-dryrun", "-cudart=shared", "-o", "/dev/null", str(SOURCES / "gc_rt.cu")], timeout_s=60)
    for line in (ran.stdout + ran.stderr).splitlines():
        if "LIBRARIES=" in line:
            dirs = re.findall(r'-L"?([^"\s]+)"?', line)
            return [d for d in dirs if not d.rstrip("/").endswith("stubs")]
    return []


def _cuda_stub(nvcc: str, out: Path, objects: list[Path]) -> Ran:
    """A `libcuda.so` (SONAME libcuda.so.1) defining every cu* symbol the objects use."""
    nm = which("nm")
    if nm is None:
        return Ran(
            ["nm"], None, "", "", 0.0, "nm not found (binutils): cannot generate the libcuda link stub"
        )
    ran = run([nm, "-u", *map(str, objects)], timeout_s=60)
    if not ran.ok:
        return ran
    names = sorted({m for m in re.findall(r"\bU (cu[A-Za-z0-9_]+)", ran.stdout)})
    out.mkdir(parents=True, exist_ok=True)
    stub = out / "libcuda_stub.c"
    stub.write_text("".join(f"void {n}(void) {{}}\n" for n in names))
    return run(
        [
            nvcc,
            "-shared",
            "-Xcompiler=-fPIC",
            "-Xlinker=-soname=libcuda.so.1",
            "-o",
            str(out / "libcuda.so"),
            str(stub),
        ],
        timeout_s=120,
    )


def _build_one(
    nvcc: str, program: Program, bin_dir: Path, rpath: list[str], strict: tuple[str, ...], log: list[str]
) -> str:
    """Build one program; empty on success, else why not (one line)."""
    source, target = SOURCES / program.source, bin_dir / program.name
    if program.driver_api:
        obj = bin_dir / f"{program.name}.o"
        steps: list[list[str] | None] = [
            [nvcc, *program.flags, *strict, "-c", "-o", str(obj), str(source)],
            None,  # the stub, from the object's undefined symbols
            [nvcc, "-o", str(target), str(obj), f"-L{bin_dir / 'stub'}", "-lcuda", "-ldl"],
        ]
    else:
        steps = [[nvcc, *program.flags, *strict, *rpath, "-o", str(target), str(source)]]
    for step in steps:
        ran = (
            _cuda_stub(nvcc, bin_dir / "stub", [bin_dir / f"{program.name}.o"])
            if step is None
            else run(step, timeout_s=300)
        )
        log.append(f"$ {shlex.join(ran.argv)} -> {ran.problem or ran.rc}")
        if not ran.ok:
            target.unlink(missing_ok=True)
            return f"build failed: {ran.why()}"
    return ""


def build_programs(build_dir: Path, nvcc: str | None = None) -> Built:
    """Build every program into `build_dir/bin`; what fails to build is named in `errors`."""
    built = Built(nvcc=nvcc or which("nvcc"))
    bin_dir = build_dir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if built.nvcc is None:
        for p in PROGRAMS:
            built.errors[p.name] = "nvcc not found: the CUDA programs were not built"
        return built
    nvcc = built.nvcc
    rpath = [f"-Xlinker=-rpath={d}" for d in _library_dirs(nvcc)]
    for program in PROGRAMS:
        target = bin_dir / program.name
        if _newer(target, [SOURCES / program.source, Path(__file__)]):
            built.programs[program.name] = target
            continue
        error = _build_one(nvcc, program, bin_dir, rpath, program.strict, built.log)
        if error:
            lenient_error = _build_one(nvcc, program, bin_dir, rpath, (), built.log)
            if lenient_error:
                built.errors[program.name] = error
                continue
            built.lenient[program.name] = error
        built.programs[program.name] = target
    return built


def build_limiter(root: Path) -> tuple[Path | None, str]:
    """`make -C native/limiter`; the library's path, or why there is none."""
    ran = run(["make", "-s", "-C", str(root / "native/limiter")], timeout_s=600)
    library = root / "native/limiter/build/libdragpu-limiter.so.1"
    if not ran.ok:
        return None, f"make -C native/limiter failed: {ran.why()}"
    if not library.is_file():
        return None, f"make -C native/limiter did not produce {library}"
    return library, ""
