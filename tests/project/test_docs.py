"""The docs a newcomer reads stay whole: the index names every page, links lead somewhere, examples are valid."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from repo_paths import ROOT

from dra_gpu.config import GpuConfig

DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "native/limiter/README.md",
    ROOT / "e2e/README.md",
    *sorted(DOCS.glob("*.md")),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def links(page: Path) -> list[str]:
    """The targets of the page's Markdown links, code blocks left out."""
    return LINK.findall(FENCE.sub("", page.read_text()))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_docs_index_links_every_page_in_docs() -> None:
    linked = {(DOCS / t.split("#")[0]).resolve() for t in links(INDEX) if not re.match(r"\w+:", t)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p != INDEX and p.resolve() not in linked]
    assert missing == [], f"link these from docs/README.md, under the heading they belong to: {missing}"


def test_every_relative_link_in_the_docs_leads_to_a_file_and_heading_that_exist() -> None:
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"\w+:", target):
                continue  # https:, mailto:
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and file.suffix == ".md" and fragment not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_gpu_configs_shown_in_the_readme_and_docs_are_accepted() -> None:
    shown = 0
    for page in PAGES:
        for language, block in FENCE.findall(page.read_text()):
            if language != "yaml" or "kind: GpuConfig" not in block:
                continue
            for document in yaml.safe_load_all(block):
                for config in _gpu_configs(document):
                    GpuConfig.model_validate(config)
                    shown += 1
    assert shown >= 2  # the README's elastic claim and the configuration page's at least


def _gpu_configs(node: object) -> list[dict[str, object]]:
    if isinstance(node, dict):
        if node.get("kind") == "GpuConfig":
            return [node]
        return [c for v in node.values() for c in _gpu_configs(v)]
    if isinstance(node, list):
        return [c for v in node for c in _gpu_configs(v)]
    return []


def test_every_repository_path_the_docs_name_exists() -> None:
    """A path in backticks whose first folder is one of the repository's (`native/limiter/src/arbiter.c`) or a
    package of `src/dra_gpu` (`plugin/sharing/modes/arbitration.py`) names a file or folder that is there."""
    tracked = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # .git, .venv
        here = Path(folder).relative_to(ROOT).as_posix()
        tracked += [f"{here}/{name}".removeprefix("./") for name in dirs + files]
    tops = {p.name for p in ROOT.iterdir() if p.is_dir()} | {
        p.name for p in (ROOT / "src" / "dra_gpu").iterdir() if p.is_dir()
    }
    gone = []
    for page in PAGES:
        for path in re.findall(r"`([\w.-]+/[\w./-]*[\w-])/?`", page.read_text()):
            if path.split("/")[0] not in tops or path.startswith(("/", ".")):
                continue
            if not any(t == path or t.endswith("/" + path) for t in tracked):
                gone.append(f"{page.relative_to(ROOT)}: {path}")
    assert gone == [], "these moved or never existed: name what is there now"
