"""Grant, then release or let lapse, one scope in a loop on an etcd coordinator, until killed.

    python etcd_history_cycler.py ETCD_URL SCOPE [control]

Every third lease is not released: its etcd lease is revoked, as etcd does when
it expires one (the holder key goes with no Txn of ours), and the next grant
journals its ``expire``. With ``control`` the journal is written the wrong
way (`split_journal` with ``after``): each change commits first and its events
go in a Txn of their own afterwards, so a kill -9 in between leaves a change
without its event.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from stockade.coordinators import etcd as recipe


def split_journal(port: Any, when: str) -> None:
    """Make ``port`` send the history's ops in a Txn of their own, ``before`` or ``after`` the change's.

    The broken variant the tests must catch: the change and its events no longer share a Txn.
    """
    real = port._txn
    layout = port._layout
    roots = (layout.journal_root, layout.prefix + b"hn/")

    def journals(op: dict[str, Any]) -> bool:
        inner = op.get("request_put") or op.get("request_delete_range")
        return inner is not None and recipe.unb64(inner["key"]).startswith(roots)

    def txn(body: dict[str, Any]) -> tuple[bool, list[dict[str, Any]], int]:
        events = [op for op in body.get("success", []) if journals(op)]
        if not events:
            return real(body)
        if when == "before":
            real({"success": events})
        answer = real({**body, "success": [op for op in body["success"] if not journals(op)]})
        if when == "after" and answer[0]:
            time.sleep(0.05)  # the window between the two Txns, wide enough for a random kill to find it
            real({"success": [_pinned(op, answer[2]) for op in events]})
        return answer

    port._txn = txn


def _pinned(op: dict[str, Any], revision: int) -> dict[str, Any]:
    """``op`` with the token it leaves to its Txn's revision ("self") written out: the change's
    revision, so that events written apart still name the right token (the control is otherwise exact)."""
    put = op.get("request_put")
    if put is None:
        return op
    shown = json.loads(recipe.unb64(put["value"]))
    for field in ("token", "open"):
        if shown.get(field) == "self":
            shown[field] = revision
    return {"request_put": {**put, "value": recipe.b64(json.dumps(shown).encode())}}


def main() -> None:
    import stockade

    url, scope = sys.argv[1], sys.argv[2]
    coord = stockade.connect(url)
    port = coord._port
    if len(sys.argv) > 3 and sys.argv[3] == "control":
        split_journal(port, "after")
    n = 0
    while True:
        n += 1
        lease = coord.acquire(scope, ttl_ms=2_000, wait_ms=30_000, holder=f"c{n}", keepalive=False)
        if n % 3:
            lease.release()
        else:  # lapses: etcd deletes the holder key, no Txn of ours
            port._revoke(int(lease.lease_id.split(".")[0]))
        if n == 4:
            print("cycling", flush=True)  # the test kills it from now on


if __name__ == "__main__":
    main()
