"""README's Layout describes the tree: every folder it names exists, and every package folder is named.

The Layout block lists ``src/stockade/``'s folders two spaces in, and the backend and adapter folders
of ``coordinators/`` and ``resources/`` four spaces in, under their parent.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "stockade"
_FOLDER = re.compile(r"^( {2}| {4})([a-z_]+)/(?:\s|$)")
#: Folders whose subfolders are each a backend or adapter, named in the Layout one by one.
_PER_BACKEND = ("coordinators", "resources")


def layout_block(readme: str) -> list[str]:
    """The lines of the code block under ``## Layout``."""
    section = readme.split("## Layout", 1)[1]
    return section.split("```", 2)[1].splitlines()


def named_folders(lines: list[str]) -> set[str]:
    """The package folders the block names, as paths under ``src/stockade/`` (``coordinators/etcd``)."""
    named: set[str] = set()
    parent = ""
    inside = False
    for line in lines:
        if line.startswith("src/stockade/"):
            inside = True
            continue
        if inside and line and not line.startswith(" "):
            inside = False  # docs/, tests/, ...: the repository's folders, not the package's
        match = _FOLDER.match(line) if inside else None
        if match is None:
            continue
        if len(match.group(1)) == 2:
            parent = match.group(2)
            named.add(parent)
        else:
            named.add(f"{parent}/{match.group(2)}")
    return named


def package_folders(package: Path = PACKAGE) -> set[str]:
    """Every package folder the Layout must name: the top level, and each backend's or adapter's folder."""
    found = set()
    for init in package.rglob("__init__.py"):
        parts = init.parent.relative_to(package).parts
        if not parts or "_async" in parts or "_sync" in parts or "__pycache__" in parts:
            continue
        if len(parts) == 1 or (len(parts) == 2 and parts[0] in _PER_BACKEND):
            found.add("/".join(parts))
    return found


def test_the_layout_names_every_package_folder_and_only_those() -> None:
    named = named_folders(layout_block((ROOT / "README.md").read_text()))
    assert not {name for name in named if not (PACKAGE / name).is_dir()}, "named but not in the tree"
    assert package_folders() - named == set(), "in the tree but not in README's Layout"


def test_the_architecture_page_names_every_top_level_folder() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    top = {name for name in package_folders() if "/" not in name}
    assert {name for name in top if f"`src/stockade/{name}/`" not in page} == set()


def test_the_layout_check_can_fail(tmp_path: Path) -> None:
    """The control: a folder the Layout forgets, and one it names that does not exist, are both found."""
    block = layout_block((ROOT / "README.md").read_text())
    forgotten = [line for line in block if not line.startswith("    etcd/")]
    assert "coordinators/etcd" in package_folders() - named_folders(forgotten)
    invented = [*block[:3], "    cassandra/   a backend that was never written", *block[3:]]
    extra = {name for name in named_folders(invented) if not (PACKAGE / name).is_dir()}
    assert extra == {"core/cassandra"}
