"""One home each: lease ids and cluster ids are minted in `stockade.coordinators._mint`, and the scope
character set is spelled once, `stockade.core.limits.SCOPE_CHARS`, which the core's check, the OpenAPI
pattern, auth's scope patterns and the PostgreSQL fence's SQL are built from.

Both are scans of the package's syntax trees (docstrings, which may show the set to a reader, are not
code), each with a control made of the spellings the tree had before.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stockade
from stockade.core.limits import SCOPE_BYTES_MAX, SCOPE_CHARS

PACKAGE = Path(stockade.__file__).parent
HOME = "coordinators/_mint.py"
#: Randomness drawn outside the home, and why it is not an id of a lease or a cluster.
OTHER_RANDOMNESS = {
    "keys.py": "a signing key's id and secret, a temporary file's name",
    "coordinators/zookeeper/_async/port.py": "the nonce of one acquire attempt's queue node",
    "coordinators/zookeeper/_sync/port.py": "the same, generated",
    "cli/check.py": "the name of a scratch scope",
    "cli/demo.py": "the name of the demo's scope",
    "cli/ui.py": "the dashboard's session key",
    "server/_dashboard.py": "the dashboard's session key",
}
_DRAWS = {"token_urlsafe", "token_hex", "token_bytes", "urandom", "getrandbits"}


def draws(source: str) -> list[str]:
    """The calls of ``source`` that draw random ids or bytes (``secrets.token_*``, ``os.urandom``, ``getrandbits``)."""
    return [ast.unparse(node) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _DRAWS]


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def charset_spellings(source: str) -> int:
    """How many string literals of ``source`` (docstrings aside) spell the scope character set."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return sum(1 for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and id(node) not in skip and SCOPE_CHARS in node.value)


def _sources() -> dict[str, str]:
    return {path.relative_to(PACKAGE).as_posix(): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def test_ids_are_minted_in_one_home() -> None:
    elsewhere = {name: found for name, source in _sources().items()
                 if name != HOME and name not in OTHER_RANDOMNESS and (found := draws(source))}
    assert elsewhere == {}, f"ids minted outside {HOME}: {elsewhere}"
    from stockade.coordinators._mint import LeaseIds, new_cluster_id, new_lease_id

    pooled = LeaseIds()
    assert len(new_lease_id()) == len(pooled()) == 32 and len(new_cluster_id()) == 16


def test_the_minting_scan_finds_the_old_ways() -> None:
    """The control: the three ways lease ids and the three ways cluster ids were minted are each found."""
    for old in ['secrets.token_urlsafe(24)', 'base64.urlsafe_b64encode(os.urandom(_LEASE_ID_BYTES)).decode()',
                'self._pool = os.urandom(_LEASE_ID_BYTES * _LEASE_ID_POOL)',
                'secrets.token_hex(CLUSTER_ID_HEX_DIGITS // 2)', 'proposed = secrets.token_hex(8)',
                'f"{self.rng.getrandbits(64):016x}"']:
        assert draws(old), old
    assert draws("new_lease_id(); new_cluster_id(self.rng)") == []


def test_the_scope_charset_is_spelled_once() -> None:
    spellings = {name: n for name, source in _sources().items() if (n := charset_spellings(source))}
    assert spellings == {"core/limits.py": 1}, spellings
    from stockade.resources.postgres._sql import FENCE_BODIES, STALE_WHEN, fence_function
    from stockade.server import _auth, openapi

    assert openapi.SCOPE_PATTERN == f"^(?!\\.{{1,2}}$)[{SCOPE_CHARS}]{{1,{SCOPE_BYTES_MAX}}}$"  # not "." nor ".."
    assert _auth._PATTERN.pattern.startswith(f"[{SCOPE_CHARS}]")
    for body in FENCE_BODIES:
        sql = fence_function(pgcrypto_schema="public", stale_when=next(iter(STALE_WHEN.values())), body=body)
        assert sql.count(f"'^[{SCOPE_CHARS}]+$'") == 2 and "@SCOPE_CHARS@" not in sql, body


def test_the_charset_scan_finds_a_spelling() -> None:
    """The control: the literals the tree had before are counted; a docstring and the constant's use are not."""
    assert charset_spellings('_SCOPE_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")') == 1
    assert charset_spellings('''SQL = r"""IF scope !~ '^[A-Za-z0-9._:-]+$' THEN"""''') == 1
    documented = 'def f():\n    """1..200 of ``[A-Za-z0-9._:-]``."""\n    return re.compile(f"[{SCOPE_CHARS}]+")\n'
    assert charset_spellings(documented) == 0
