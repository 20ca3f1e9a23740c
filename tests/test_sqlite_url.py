"""One SQLite url convention, SQLAlchemy's, wherever stockade takes one (`stockade.transport.sqlite_url`).

``sqlite:///rel.db`` is relative to the working directory, ``sqlite:////abs.db`` absolute. The
development versions read ``sqlite:///abs.db`` as absolute and ``sqlite://rel.db`` as relative; a url
that would now name another file is refused in one line, and nothing is created where either reading
points. The control is that old reading itself: it disagrees with SQLAlchemy on the same urls.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import PYTHON, python_env

import stockade
from stockade.core.errors import InvalidArgument
from stockade.transport.sqlite_url import sqlite_path, sqlite_url

URLS = ["sqlite:///app.db", "sqlite:///data/app.db", "sqlite:////srv/app/app.db", "sqlite:///./x.db",
        "sqlite:////tmp/a b/app.db"]


def _old_reading(url: str) -> Path:
    return Path(url.partition("://")[2])


def test_stockade_and_sqlalchemy_name_the_same_file_and_the_old_reading_did_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    agree = [url for url in URLS if sqlite_path(url) == Path(sa.engine.make_url(url).database)]
    old_agree = [url for url in URLS if _old_reading(url) == Path(sa.engine.make_url(url).database)]
    assert agree == URLS
    assert len(old_agree) < len(URLS), old_agree  # the control: the old reading named other files


def test_relative_and_absolute_files_are_created_where_the_url_says(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with stockade.connect("sqlite:///coord.db?process=embedded") as coord:
        cluster = coord.cluster_id
    assert (tmp_path / "coord.db").is_file() and not Path("/coord.db").exists()
    absolute = tmp_path / "abs" / "coord.db"
    absolute.parent.mkdir()
    with stockade.connect(sqlite_url(absolute)) as coord:
        assert coord.cluster_id != cluster
    assert sqlite_url(absolute) == f"sqlite:///{absolute}" and sqlite_url(absolute).startswith("sqlite:////")
    assert absolute.is_file()


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("make_url, says", [
    (lambda d: "sqlite://data/coord.db", "write sqlite:///data/coord.db"),
    (lambda d: f"sqlite://{d}/coord.db", "write sqlite:////"),  # the old reading's absolute path
    (lambda d: f"sqlite://{d.relative_to('/')}/coord.db", "no host part"),
    (lambda d: "sqlite://", "no host part"),
    (lambda d: "sqlite:///", "needs a file path"),
    (lambda d: "sqlite:///dir/", "needs a file path"),
    (lambda d: "sqlite:///a\x00b.db", "NUL"),
])
def test_an_old_style_or_bad_url_is_refused_in_one_line_and_creates_nothing(tmp_path, monkeypatch, make_url, says):
    cwd, target = tmp_path / "cwd", tmp_path / "target"
    cwd.mkdir()
    target.mkdir()
    monkeypatch.chdir(cwd)
    url = make_url(target)
    for opener in (stockade.connect, lambda u: stockade.open_store(u, cluster_id="c" * 16)):
        with pytest.raises(InvalidArgument) as caught:
            opener(url)
        assert says in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert _listing(tmp_path) == ["cwd", "target"]


def test_an_existing_file_at_the_old_absolute_reading_is_never_replaced_by_a_new_relative_one(tmp_path, monkeypatch):
    old = tmp_path / "old" / "coord.db"
    old.parent.mkdir()
    stockade.connect(sqlite_url(old)).close()
    before = old.read_bytes()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(InvalidArgument, match=f"write sqlite:///{old}"):
        stockade.connect(f"sqlite:///{str(old).lstrip('/')}")
    assert old.read_bytes() == before and _listing(cwd) == []


def test_the_command_line_says_the_same_in_one_line_with_exit_2(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "cwd").mkdir()
    old_style = f"sqlite:///{str(tmp_path / 'target').lstrip('/')}/coord.db"
    for argv in (["lock", "--url", "sqlite://target/coord.db", "s", "--", "true"],
                 ["lock", "--url", old_style, "s", "--", "true"],
                 ["status", "--url", "sqlite://target/coord.db"]):
        done = subprocess.run([PYTHON, "-m", "stockade", *argv], cwd=tmp_path / "cwd", env=python_env(),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (argv, done)
        assert len(done.stderr.strip().splitlines()) == 1 and "sqlite:///" in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stderr
    assert _listing(tmp_path) == ["cwd", "target"]


def test_the_working_directory_reading_wins_when_that_file_exists(tmp_path, monkeypatch):
    """``sqlite:///x/coord.db`` with ``./x/coord.db`` present is that file, even if ``/x`` exists too."""
    monkeypatch.chdir(tmp_path)
    relative = Path(str(tmp_path).lstrip("/")) / "coord.db"  # tmp/.../coord.db under the cwd: also /tmp/... exists
    relative.parent.mkdir(parents=True)
    stockade.connect(f"sqlite:///{relative}?process=embedded").close()
    assert (tmp_path / relative).is_file() and not (tmp_path / "coord.db").exists()
    assert os.path.isfile(sqlite_path(f"sqlite:///{relative}"))


def test_no_file_of_the_project_builds_a_sqlite_url_the_old_way():
    """``f"sqlite://{path}"`` with an absolute path was the old absolute form; it now reads as relative."""
    root = Path(__file__).resolve().parent.parent
    old_style = re.compile(r"""sqlite://(\{|["'] *\+)""")
    found = [f"{path.relative_to(root)}:{number}"
             for folder in ("src", "tests", "benchmarks", "docs", "examples", "scripts")
             for path in sorted((root / folder).rglob("*")) if path.suffix in (".py", ".md", ".sh")
             and path.name != "test_sqlite_url.py"
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if old_style.search(line)]
    found += [f"README.md:{n}" for n, line in enumerate((root / "README.md").read_text().splitlines(), 1)
              if old_style.search(line)]
    assert found == []
    assert old_style.search("""stockade.connect(f"sqlite://{tmp}/coord.db")""")  # the control: the old form is seen
