"""Ports are typed to the end: no ``getattr``/``hasattr`` on a port anywhere in the package.

What a caller may ask of a port is in its protocol (`AsyncCoordinatorPort`, `AsyncStorePort`,
`TransactionalStorePort`, `FenceAdapterPort`) or declared by a type it derives from (`Leased` for a held
lease, `Journaled` for a record store that keeps a journal) or a capability of its registry entry
(`Capability.NATIVE_WAIT` for a backend that wakes its waiters). Probing an object for a member instead
(``getattr(self._port, "history", None)``, ``hasattr(token, "raise_if_lost")``) hides a missing member
until a user meets it, so the scan below fails on it.

A call is counted when it is ``getattr``/``hasattr`` and either its object is named as a port is
(``port``, ``_port``, ``records``, ``engine``, ``waking``, ``lease``, ``coord``), or the member it asks for
is one of those protocols' members, unless the object is one of `NOT_PORTS` (named with the reason).
"""

from __future__ import annotations

import ast
from pathlib import Path

import stockade
from stockade.client._async.port import AsyncCoordinatorPort, AsyncStorePort
from stockade.client._shared import Leased
from stockade.coordinators.journal import Journaled
from stockade.resources.port import FenceAdapterPort, TransactionalStorePort

PACKAGE = Path(stockade.__file__).parent
PORT_NAMES = {"port", "_port", "records", "engine", "waking", "lease", "coord", "coordinator"}
#: Objects whose members share a name with a port's and are not ports: what each is.
NOT_PORTS = {
    "error": "an exception's structured fields (`token`, `high_water` of `StaleToken`)",
    "keys": "a keyring given by the user: its `cluster_id`, where it has one",
}


def _members(*classes: type) -> set[str]:
    names: set[str] = set()
    for cls in classes:
        for klass in cls.__mro__:
            if klass is not object:
                names |= {n for n in vars(klass) if not n.startswith("__") and not n.startswith("_abc")}
                names |= set(vars(klass).get("__annotations__", {}))
    return names - {"_is_protocol", "_is_runtime_protocol"}


PORT_MEMBERS = _members(AsyncCoordinatorPort, AsyncStorePort, TransactionalStorePort, FenceAdapterPort, Leased,
                        Journaled)


def _receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def port_probes(source: str) -> list[str]:
    """The ``getattr``/``hasattr`` calls on a port in ``source``, as written."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args):
            continue
        receiver = _receiver(node.args[0])
        member = node.args[1] if len(node.args) > 1 else None
        asks_port_member = isinstance(member, ast.Constant) and member.value in PORT_MEMBERS
        if receiver in PORT_NAMES or (asks_port_member and receiver not in NOT_PORTS):
            found.append(ast.unparse(node))
    return found


def test_no_getattr_or_hasattr_on_a_port() -> None:
    probes = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = port_probes(path.read_text())
        if found:
            probes[path.relative_to(PACKAGE).as_posix()] = found
    assert probes == {}, f"ports probed instead of typed (declare the member in the port's protocol): {probes}"


def test_the_scan_finds_a_probe() -> None:
    """The control: the probes this tree had before its ports were typed are each found; others are not."""
    before = [
        'history = getattr(self._port, "history", None)',
        'keys = getattr(self._port, "keys", None)',
        'history = getattr(self.port, "history", None)',
        'history = getattr(records, "history", None)',
        'if hasattr(token, "raise_if_lost"): pass',
        'lease = getattr(lease, "_enclosing", None)',
        'bound = getattr(engine, "value_bytes_max", 0)',
        'ok = callable(getattr(coord, "acquire", None))',
    ]
    for line in before:
        assert port_probes(line), line
    for fine in ['getattr(error, "token", None)', 'getattr(keys, "cluster_id", None)', 'getattr(args, "url", None)',
                 'getattr(self, name)', 'self._port.history(scope, limit=3)']:
        assert port_probes(fine) == [], fine
    assert {"history", "keys", "raise_if_lost", "value_bytes_max", "_enclosing"} <= PORT_MEMBERS
