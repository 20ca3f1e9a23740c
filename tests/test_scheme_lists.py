"""Scheme knowledge lives in the two registries: no other file spells a list of url schemes.

`stockade.coordinators.registry.COORDINATORS` (coordinators, and the HTTP remote's store) and
`stockade.resources.registry` (stores and floor targets) are the only places that name schemes as a list.
Every other list, message, help text and test parameter is read from them, so adding a backend is one
folder and one registry line, and no message goes stale. A "scheme list" is a literal tuple, list, set or
dict with two or more registered schemes among its strings, or a message naming two or more after
``supported:``. Prose that shows example urls (docstrings, help text such as ``sqlite:///path or
http://host``) is not counted.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import stockade
from stockade.coordinators.registry import COORDINATORS
from stockade.resources.registry import FLOOR_TARGETS, SCHEMES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(stockade.__file__).parent
REGISTRIES = {PACKAGE / "coordinators" / "registry.py", PACKAGE / "resources" / "registry.py"}
#: Test files that still pick backends by a literal list of schemes (a subset a test runs on); each is to
#: read the registry. Listed so the count only goes down: a file here that no longer spells one fails.
PENDING = {
    "tests/test_cluster_disk.py", "tests/test_docs_run.py",
    "tests/test_election.py", "tests/test_engine_faults.py",
    "tests/test_fence_retry_kill.py", "tests/test_history_etcd.py",
    "tests/test_shard_log.py", "tests/test_store_conformance.py", "tests/test_store_transactions.py",
    "tests/test_frozen_bounds.py",  # landed with issue 27
    "tests/test_package.py",  # the package extras, named like the backends they install drivers for
}
KNOWN = set(COORDINATORS) | set(SCHEMES) | set(FLOOR_TARGETS)
_SUPPORTED = re.compile(r"supported: ([a-z, ]+)")


def scheme_lists(path: Path) -> list[int]:
    """The line numbers in ``path`` where a scheme list is spelled."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elements = node.elts
        elif isinstance(node, ast.Dict):
            elements = [key for key in node.keys if key is not None]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named: set[str] = set()
            for listed in _SUPPORTED.findall(node.value):
                named |= {word.strip() for word in listed.split(",")} & KNOWN
            if len(named) >= 2:
                found.append(node.lineno)
            continue
        else:
            continue
        strings = {e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if len(strings & KNOWN) >= 2:
            found.append(node.lineno)
    return found


def _tree() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))
    here = Path(__file__).resolve()  # holds the control's planted text
    return [path for path in files if path not in REGISTRIES and path != here and "__pycache__" not in path.parts]


def test_no_file_but_the_registries_spells_a_scheme_list() -> None:
    spelled = {path.relative_to(ROOT).as_posix(): lines for path in _tree() if (lines := scheme_lists(path))}
    assert set(spelled) - PENDING == set(), f"scheme lists outside the registries: {spelled}"
    assert PENDING <= set(spelled), f"no longer spells a scheme list, take it off PENDING: {PENDING - set(spelled)}"
    assert not any(name.startswith("src/") for name in spelled)


def test_the_registries_spell_them() -> None:
    """The control, in the tree: the check finds the lists the registries do spell."""
    assert all(scheme_lists(path) for path in REGISTRIES)


def test_a_planted_scheme_list_is_caught(tmp_path: Path) -> None:
    """The control: a tuple, a dict, a help text and an error message that list schemes are each caught."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        'PLANNED = ("etcd", "zk")\n'
        'TARGETS = {"redis": 1, "file": 2}\n'
        'HELP = "a url; supported: sqlite, http"\n'
        'def f(s):\n'
        '    raise ValueError(f"unknown scheme {s!r}; supported: sqlite, http, https")\n'
        'ONE = ("sqlite",)\n'
    )
    assert scheme_lists(planted) == [1, 2, 3, 5]


def test_open_store_names_the_schemes_it_opens() -> None:
    """``open_store`` read a stale list: "planned but not available" for postgresql://, and no memory."""
    import pytest

    from stockade.coordinators.registry import COORDINATORS as coordinators

    served = sorted({*SCHEMES, *(s for s, backend in coordinators.items() if backend.store is not None)})
    for url in ["postgresql://db/x", "nope://x"]:
        with pytest.raises(stockade.InvalidArgument) as caught:
            stockade.open_store(url)
        assert "planned" not in str(caught.value)
        assert f"supported: {', '.join(served)}" in str(caught.value) and "memory" in served
