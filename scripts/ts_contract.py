"""Write the contract vectors the TypeScript client's tests read (clients/typescript/test/contract.json).

The Python side is the reference: the token encodings are made and parsed by
`stockade.FencingToken`, the problem documents by `stockade.wire.problems`
(each with the typed error `error_for` makes of it), and the route table is
read from the OpenAPI document `stockade serve` renders. The TypeScript tests
hold the client to every entry; tests/test_typescript_client.py fails when the
checked-in file differs from what this script writes (run it after changing
the wire contract)::

    python scripts/ts_contract.py            # rewrite the file
    python scripts/ts_contract.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import stockade
from stockade.server.openapi import openapi_document
from stockade.wire import problems

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "clients" / "typescript" / "test" / "contract.json"

CLUSTER = "c0ffee00c0ffee00"
MAC = "AbCdEfGhIjKlMnOpQr_-12"
KID = "1a2b3c4d"


def _tokens() -> dict[str, Any]:
    made = [
        stockade.FencingToken(CLUSTER, "reports", 17, kid=KID, mac=MAC),
        stockade.FencingToken(CLUSTER, "reports", 17),
        stockade.FencingToken(CLUSTER, "a.b.c", 2**63 - 1, kid=KID, mac=MAC),
        stockade.FencingToken(CLUSTER, "x:y_z-1", 387321252131373057, kid=KID, mac=MAC),
        stockade.FencingToken(CLUSTER, "s" * 200, 1),
    ]
    valid = [{"encoded": t.encode(), "cluster": t.cluster, "scope": t.scope, "value": str(t.value),
              "signed": t.signed, "shown": str(t)} for t in made]
    for entry in valid:  # the reference parses what it wrote, to the same fields
        back = stockade.FencingToken.decode(entry["encoded"])
        assert (back.cluster, back.scope, str(back.value)) == (entry["cluster"], entry["scope"], entry["value"])
    invalid = [
        "", "stk1", "stk1.c0ffee00c0ffee00.17", f"stk3.{CLUSTER}.17.reports", f"STK1.{CLUSTER}.17.reports",
        "stk1.C0FFEE00C0FFEE00.17.reports", f"stk1.{CLUSTER[:-1]}.17.reports", f"stk1.{CLUSTER}.0.reports",
        f"stk1.{CLUSTER}.017.reports", f"stk1.{CLUSTER}.-1.reports", f"stk1.{CLUSTER}.{2**63}.reports",
        f"stk1.{CLUSTER}.1e3.reports", f"stk1.{CLUSTER}.17.", f"stk1.{CLUSTER}.17.rep orts",
        f"stk1.{CLUSTER}.17..", f"stk1.{CLUSTER}.17.{'s' * 201}", f"stk2.{CLUSTER}.17.reports",
        f"stk2.{CLUSTER}.17.{KID}.reports", f"stk2.{CLUSTER}.17.1A2B3C4D.{MAC}.reports",
        f"stk2.{CLUSTER}.17.{KID}.{MAC[:-1]}.reports", f"stk2.{CLUSTER}.17.{KID}.{MAC[:-1]}+.reports",
        f"stk1.{CLUSTER}.17.r\u00e9ports",
    ]
    for text in invalid:
        try:
            stockade.FencingToken.decode(text)
        except stockade.InvalidArgument:
            continue
        raise AssertionError(f"the reference accepts {text!r}: it is not an invalid vector")
    return {"valid": valid, "invalid": invalid}


def _expected(status: int, body: bytes) -> dict[str, Any]:
    """What the Python client raises for an answer: the class and its structured fields."""
    error, _ = problems.error_for(status, body, scope="reports", wait_ms=250)
    fields: dict[str, Any] = {}
    if isinstance(error, stockade.StaleToken):
        fields = {"token": str(error.token), "highWater": str(error.high_water)}
    elif isinstance(error, stockade.TokenMismatch):
        fields = {"reason": error.reason}
    elif isinstance(error, stockade.LockTimeout):
        fields = {"scope": error.scope, "waitMs": error.wait_ms}
    elif isinstance(error, stockade.InvalidArgument):
        fields = {"field": error.field}
    elif isinstance(error, stockade.LimitExceeded):
        fields = {"limit": error.limit}
    return {"class": type(error).__name__, "fields": fields}


def _problems() -> list[dict[str, Any]]:
    token = stockade.FencingToken(CLUSTER, "reports", 387321252131373057, kid=KID, mac=MAC)
    errors = [
        stockade.StaleToken(token, 2**63 - 1),
        stockade.TokenMismatch(token, "forged (unsigned)", "this server's cluster"),
        stockade.TokenMismatch(token, "wrong-scope", "reports"),
        stockade.LockTimeout("reports", 250),
        stockade.NotHolder("abc123", "lease expired"),
        stockade.InvalidArgument("ttl_ms", "must be in 100..3600000, got 5"),
        stockade.LimitExceeded("waiters_per_scope_max", 1024, "queue full"),
        stockade.Unauthorized("no token"),
        stockade.BackendUnavailable("disk full"),
        stockade.InvariantViolation("a bug"),
    ]
    answers: list[tuple[str, int, bytes]] = []
    for error in errors:
        status, document = problems.problem_of(error)
        answers.append((type(error).__name__, status, json.dumps(document).encode()))
    status, document = problems.problem_of(stockade.InvalidArgument("holder", "bad"), body_field=True)
    answers.append(("InvalidArgument (a body field)", status, json.dumps(document).encode()))
    status, document = problems.problem_of(stockade.LimitExceeded("value_bytes_max", 2, "big"), body_field=True)
    answers.append(("LimitExceeded (a body size)", status, json.dumps(document).encode()))
    for code in ("not-found", "method-not-allowed", "unsupported-media-type"):
        status, document = problems.problem_document(code, detail=code)
        answers.append((code, status, json.dumps(document).encode()))
    status, document = problems.problem_document("unauthorized", status=403, detail="scope not covered")
    answers.append(("unauthorized (403)", status, json.dumps(document).encode()))
    # Answers without a problem type (a proxy, an older server): judged by status.
    answers += [("bare 410", 410, b""), ("bare 413", 413, b"too big"), ("bare 404", 404, b"<html>nope</html>"),
                ("bare 502", 502, b"<html>bad gateway</html>"), ("bare 418", 418, b"{}")]
    return [{"name": name, "status": status, "body": body.decode(), **_expected(status, body)}
            for name, status, body in answers]


def _routes() -> list[dict[str, str]]:
    document = openapi_document(auth=True, value_bytes_max=1024 * 1024)
    routes = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            routes.append({"operationId": operation["operationId"], "method": method.upper(), "path": path})
    return routes


def contract() -> str:
    vectors = {
        "comment": "Written by scripts/ts_contract.py from the Python side; do not edit by hand.",
        "problemTypePrefix": problems.PROBLEM_TYPE_PREFIX,
        "problemTypes": [{"code": p.code, "title": p.title, "status": p.status}
                         for p in problems.PROBLEM_TYPES.values()],
        "tokens": _tokens(),
        "problems": _problems(),
        "routes": _routes(),
    }
    return json.dumps(vectors, indent=1, ensure_ascii=True) + "\n"


def main(argv: list[str]) -> int:
    text = contract()
    if argv == ["--check"]:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run python scripts/ts_contract.py", file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: ts_contract.py [--check]", file=sys.stderr)
        return 2
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
