"""Every code block in README.md and docs/ runs, as written, in a fresh directory (tests/helpers/docblocks.py).

A block that is deliberately not run carries ``<!-- doc: skip REASON -->`` in
the file itself. `test_a_broken_example_fails` is the control: the same runner
fails on a block that is wrong.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ServeProcess, stop_host_processes
from helpers.docblocks import Runner, blocks, environment, run_file

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ENV_BIN = Path(sys.executable).parent


def _serve(workdir: Path) -> tuple[dict[str, str], Callable[[], None]]:
    # README's server keeps its data in its own directory; here it is the earlier blocks' stockade-data, whose
    # file the default url's host process may still hold (until its 30 s idle exit): stopped first.
    stop_host_processes(workdir / "stockade-data")
    server = ServeProcess(workdir / "stockade-data")
    return {"127.0.0.1:7390": f"127.0.0.1:{server.port}"}, server.stop


def _postgres(workdir: Path) -> tuple[dict[str, str], Callable[[], None]]:
    """A fresh database of its own on the session's PostgreSQL (an initdb per document took 3-8 s)."""
    from stockade.testing.servers import postgres as pg_helper

    server = pg_helper.shared_server()
    name = pg_helper.fresh_database(server)
    return {"127.0.0.1:5432/postgres": f"127.0.0.1:{server.port}/{name}"}, lambda: pg_helper.drop_database(server, name)


def _redis(workdir: Path) -> tuple[dict[str, str], Callable[[], None]]:
    from stockade.testing.servers.redis import RedisServer

    server = RedisServer(workdir / "redis")
    return {"127.0.0.1:6379": f"127.0.0.1:{server.port}"}, server.stop


SERVICES = {"serve": _serve, "postgres": _postgres, "redis": _redis}


ADMIN_TOKEN = "docs-admin-token-2f6a9c1d7e8b0a4f"
EMBEDDED = 'stockade.connect("sqlite:///stockade-data/coord.db")'


def test_readme_adapter_examples_run_against_serve(tmp_path: Path) -> None:
    """README's adapter examples (PostgreSQL, Redis) with ``stockade.connect("http://...")`` in place of the
    embedded coordinator: ``coord.verify_keys()`` fetches the server's keyring with an administrator's token
    (``$STOCKADE_AUTH_TOKEN``, a line without scopes in ``--auth-tokens``; docs/tokens.md)."""
    readme = ROOT / "README.md"
    adapter = [b for b in blocks(readme) if b.directive in ("postgres", "redis")]
    assert len(adapter) >= 2 and all(EMBEDDED in b.code for b in adapter), [b.where for b in adapter]
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN_TOKEN}\n")
    server = ServeProcess(tmp_path / "serve-data", "--auth-tokens", str(tokens))
    work = tmp_path / "work"
    work.mkdir()
    runner = Runner(work, {**environment(ENV_BIN), "STOCKADE_AUTH_TOKEN": ADMIN_TOKEN}, SERVICES)
    runner.substitutions[EMBEDDED] = f'stockade.connect("{server.url}")'
    try:
        for block in adapter:
            runner.run(block)
    finally:
        runner.close()
        server.stop()
    assert runner.ran == [b.where for b in adapter]
    assert not (work / "stockade-data").exists()  # nothing ran on an embedded coordinator


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_every_code_block_runs(doc: Path, tmp_path: Path) -> None:
    run_file(doc, tmp_path, environment(ENV_BIN), SERVICES)


def test_every_document_is_checked_and_blocks_are_run() -> None:
    runnable = [b for doc in DOCS for b in blocks(doc) if b.lang and b.directive not in ("skip", "file")]
    assert len(runnable) >= 4, [b.where for b in runnable]


BROKEN = """# A page

```python
x = 1
```

<!-- doc: skip it needs a cluster of 40 machines -->
```sh
exit 3
```

```python
assert x == 2, "the example is out of date"
```
"""


def test_a_broken_example_fails(tmp_path: Path) -> None:
    doc = tmp_path / "broken.md"
    doc.write_text(BROKEN)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(AssertionError, match="the example is out of date"):
        run_file(doc, work, environment(ENV_BIN), SERVICES)
    fixed = tmp_path / "fixed.md"
    fixed.write_text(BROKEN.replace("x == 2", "x == 1"))
    assert run_file(fixed, tmp_path / "work", environment(ENV_BIN), SERVICES) == ["fixed.md:3", "fixed.md:12"]


def test_a_skip_needs_its_reason(tmp_path: Path) -> None:
    doc = tmp_path / "bad.md"
    doc.write_text("<!-- doc: skip -->\n```sh\ntrue\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        blocks(doc)
