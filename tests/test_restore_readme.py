"""README's restore snippet, executed: a store lost after a backup comes back with no mark lowered.

The snippet is read from README.md (the python block of "Backup and
restore") and run in its two halves: the backup, then, after a scope was
created and written and the store file was lost, the restore.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import stockade
from stockade.core.errors import StaleToken
from stockade.keys import KeyFile
from stockade.resources.store import SQLiteStore

README = Path(__file__).resolve().parent.parent / "README.md"


def snippet() -> tuple[str, str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Backup and restore"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    first, second = code.split("# ... later", 1)
    return first, "# ... later" + second


def test_readme_restore_snippet_lowers_no_mark(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    first, second = snippet()
    coord = stockade.connect(f"sqlite:///{data}/coord.db")  # as the snippet opens it: the default url
    store = stockade.open_store(f"sqlite:///{data}/store.db", cluster_id=coord.cluster_id)
    try:
        with coord.lock("reports", ttl_ms=10_000) as lease:
            store.put("reports", "daily.csv", b"v1", token=lease.token)
            before_backup = lease.token.value
        namespace = {"data": data}
        exec(compile(first, "README.md (backup)", "exec"), namespace)  # noqa: S102 - the snippet under test
        marks: dict[str, int] = {}
        earlier: dict[str, list[int]] = {"reports": [before_backup], "late": []}
        for scope in ("reports", "late", "late"):  # "late" exists only after the backup
            with coord.lock(scope, ttl_ms=10_000) as lease:
                store.put(scope, "k", b"after the backup", token=lease.token)
                if scope in marks:
                    earlier[scope].append(marks[scope])
                marks[scope] = lease.token.value
    finally:
        store.close()
    for suffix in ("", "-wal", "-shm"):  # the store is lost
        Path(f"{data}/store.db{suffix}").unlink(missing_ok=True)
    try:
        exec(compile(second, "README.md (restore)", "exec"), namespace)  # noqa: S102
    finally:
        namespace["coord"].close()
        coord.close()
    capsys.readouterr()
    report = namespace["report"]
    keys = KeyFile(data / "coord.keys")
    with SQLiteStore(data / "store.db", keys=keys) as restored:
        lowered = [s for s, mark in marks.items() if restored.high_water(s) < mark]
        zombies = 0
        for scope, mark in marks.items():
            # every token a zombie of this scope could hold: each earlier holder's, the first, the one just below
            for value in sorted({1, mark - 1, *earlier[scope]}):
                try:
                    token = keys.sign(stockade.FencingToken(coord.cluster_id, scope, value))  # a real, old token
                    restored.put(scope, "k", b"zombie", token=token)
                    zombies += 1
                except StaleToken:
                    pass
    with capsys.disabled():
        print(f"\n[figure] README restore snippet, old store lost, scope created after the backup: "
              f"marks lowered {len(lowered)} of {len(marks)}; zombie writes accepted {zombies}")
    assert lowered == [] and zombies == 0
    assert report.raised == {"reports": (before_backup, marks["reports"]), "late": (0, marks["late"])}
    assert report.old_store == "missing"


def test_readme_no_longer_shows_a_callable_or_partial_floor():
    text = README.read_text(encoding="utf-8")
    assert "fence_floors=coord_engine.last_issued" not in text
    with pytest.raises(ValueError):
        text.index("fence_floors={}")
