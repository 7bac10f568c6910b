"""tests/ mirrors src/: each test module sits in `tests/<name>/`, where `<name>` is the package or module of
`src/dra_gpu` it tests (`tests/plugin/` for `dra_gpu/plugin/`, `tests/quantity/` for `dra_gpu/quantity.py`), another
package of `src/` (`tests/cdi/`), or one of `PROJECT_WIDE`'s names.

Test modules are imported by their file name (pytest's "prepend" mode, CONTRIBUTING.md "Tests"), so two with one
name would collide, and a test module is imported only by tests of its own directory (what two share is a
helper at the top of tests/); both are checked here too.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

from repo_paths import ROOT, TESTS

PROJECT_WIDE = {
    "project": "the project as a whole: layering, object access, the API schemas, the image build, the docs",
    "gpucheck": "the GPU check (gpucheck/ at the root of the checkout)",
    "native": "the native limiter (native/limiter), through its C test suite",
    "container": "real containers through podman (docs/container-tests.md)",
}


def mirror_names(src: Path) -> set[str]:
    """The directory names a test module may sit in: src/dra_gpu's packages and modules, src's other packages."""
    dra_gpu = src / "dra_gpu"
    names = {p.stem for p in dra_gpu.glob("*.py")} | {
        p.name for p in dra_gpu.iterdir() if (p / "__init__.py").exists()
    }
    names |= {p.name for p in src.iterdir() if (p / "__init__.py").exists() and p.name != "dra_gpu"}
    return {n for n in names if not n.startswith("_")} | set(PROJECT_WIDE)


def misplaced(tests: Path, allowed: set[str]) -> list[str]:
    """One line per test module that is not in `tests/<allowed name>/`, saying where it belongs."""
    problems = []
    for path in sorted(tests.rglob("test_*.py")):
        where = path.relative_to(tests)
        if len(where.parts) != 2:
            problems.append(
                f"tests/{where}: move it to tests/<name>/, <name> the package or module of src/dra_gpu it tests"
            )
        elif where.parts[0] not in allowed:
            problems.append(
                f"tests/{where}: tests/{where.parts[0]}/ mirrors nothing in src/; move it to the directory of the "
                f"package it tests, or add the name to PROJECT_WIDE in {Path(__file__).name} with what it covers"
            )
    return problems


def test_every_test_module_sits_in_the_directory_of_what_it_tests() -> None:
    assert misplaced(TESTS, mirror_names(ROOT / "src")) == []


def test_a_flat_test_module_or_a_directory_that_mirrors_nothing_is_reported(tmp_path: Path) -> None:
    for name in (
        "test_flat.py",
        "plugin/test_in_place.py",
        "plugin/sharing/test_too_deep.py",
        "misc/test_stray.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = misplaced(tmp_path, {"plugin"})
    assert [line.split(":")[0] for line in found] == [
        "tests/misc/test_stray.py",
        "tests/plugin/sharing/test_too_deep.py",
        "tests/test_flat.py",
    ]


def test_the_mirror_names_are_the_packages_and_modules_of_src() -> None:
    names = mirror_names(ROOT / "src")
    assert {"plugin", "kube", "quantity", "cdi", "project"} <= names
    assert not {"_proto", "dra_gpu", "templates"} & names


def test_no_two_test_modules_or_helpers_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name not in ("conftest.py", "__init__.py"):
            by_name[path.name].append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def test_no_test_module_is_imported_from_another_directory() -> None:
    """What tests of two directories share is a helper at the top of tests/; a test module of another
    directory is importable only with that directory on `pythonpath`, where its name would shadow others."""
    pythonpath = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "pythonpath"
    ]
    assert pythonpath == [".", "tests"], "pythonpath holds the root (gpucheck) and tests/ (the helpers) only"
    modules = {path.stem: path.parent for path in TESTS.rglob("test_*.py")}
    crossing = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                home = modules.get(name)
                if home is not None and home != path.parent:
                    crossing.append(
                        f"{path.relative_to(ROOT)} imports {name} of {home.relative_to(ROOT)}: move what it "
                        f"needs to a helper at the top of tests/"
                    )
    assert crossing == []
