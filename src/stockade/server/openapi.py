"""The OpenAPI 3.1 document served at ``/openapi.json``: the route table of `stockade.wire.routes` as a schema.

Every path, operation, parameter, body and answer comes from the table (the
same one the server dispatches from and the client builds its targets
from); this module adds the JSON schemas. The bounds come from
`stockade.core.limits`, so the schema and the validators cannot drift
apart. The schema is as strict as the server: whatever it calls invalid,
the server rejects with a 4xx (schemathesis checks both directions).
"""

from __future__ import annotations

from typing import Any

from stockade.core.limits import (
    CONTENDERS_MAX,
    HOLDER_BYTES_MAX,
    IDEMPOTENCY_KEY_BYTES_MAX,
    KEY_BYTES_MAX,
    LIST_PAGE_MAX,
    SCOPE_BYTES_MAX,
    SCOPE_CHARS,
    TOKEN_VALUE_MAX,
    TTL_MS_MAX,
    TTL_MS_MIN,
    TX_WRITES_MAX,
    WAIT_MS_MAX,
    WAIT_MS_MIN,
)
from stockade.server._tickets import TICKET_PATTERN
from stockade.wire import API_VERSION
from stockade.wire.codecs import (
    COMMIT_SEQ_HEADER,
    FENCING_TOKEN_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    JSON,
    OCTETS,
    PROBLEM_JSON,
    TOKEN_VALUE_HEADER,
)
from stockade.wire.routes import ROUTES, Route

__all__ = ["openapi_document", "JSON_BODY_BYTES_MAX"]

JSON_BODY_BYTES_MAX = 8 * 1024

# ``.`` and ``..`` are path steps, not names (`core.limits.validate_scope`): the patterns leave them out.
_NOT_A_STEP = "(?!\\.{1,2}$)"
SCOPE_PATTERN = f"^{_NOT_A_STEP}[{SCOPE_CHARS}]{{1,{SCOPE_BYTES_MAX}}}$"
LEASE_ID_PATTERN = "^[A-Za-z0-9_-]{16,64}$"
# The signed form a coordinator issues (docs/tokens.md); the unsigned stk1 form only a store without keys takes.
# A value of at most 18 digits, or 19 starting 1-8: always within 1..2**63-1 (the few values above
# 8999999999999999999 that the server also takes are left out of the pattern, never let in).
_VALUE = "(?:[1-9][0-9]{0,17}|[1-8][0-9]{18})"
TOKEN_PATTERN = (
    f"^(stk2\\.[0-9a-f]{{16}}\\.{_VALUE}\\.[0-9a-f]{{8}}\\.[A-Za-z0-9_-]{{22}}"
    f"|stk1\\.[0-9a-f]{{16}}\\.{_VALUE})"
    f"\\.{_NOT_A_STEP}[{SCOPE_CHARS}]{{1,{SCOPE_BYTES_MAX}}}$"
)
PRINTABLE_PATTERN = "^[\\x21-\\x7e]+$"
BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def _json(description: str, ref: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


_SCOPE_PARAM = {"name": "scope", "in": "path", "required": True,
                "schema": {"type": "string", "pattern": SCOPE_PATTERN, "minLength": 1, "maxLength": SCOPE_BYTES_MAX}}
_LEASE_PARAM = {"name": "lease_id", "in": "path", "required": True,
                "description": "The secret lease id returned by acquire.",
                "schema": {"type": "string", "pattern": LEASE_ID_PATTERN, "minLength": 16, "maxLength": 64}}
_KEY_PARAM = {"name": "key", "in": "path", "required": True,
              "description": f"Percent-encoded UTF-8, 1..{KEY_BYTES_MAX} bytes, no NUL.",
              "schema": {"type": "string", "minLength": 1, "maxLength": KEY_BYTES_MAX, "pattern": "^[^\\u0000]+$"}}
_AFTER_SCOPE = {"name": "after", "in": "query", "required": False,
                "description": "Page after this scope (the previous page's next_after).",
                "schema": {"type": "string", "pattern": SCOPE_PATTERN, "minLength": 1, "maxLength": SCOPE_BYTES_MAX}}
_AFTER_KEY = {"name": "after", "in": "query", "required": False,
              "description": "Page after this key (the previous page's next_after).",
              "schema": {"type": "string", "minLength": 1, "maxLength": KEY_BYTES_MAX, "pattern": "^[^\\u0000]+$"}}
_LIMIT = {"name": "limit", "in": "query", "required": False,
          "schema": {"type": "integer", "minimum": 1, "maximum": LIST_PAGE_MAX, "default": LIST_PAGE_MAX}}
_TOKEN_HEADER = {"name": FENCING_TOKEN_HEADER, "in": "header", "required": True,
                 "description": "The encoded fencing token, verbatim from acquire.",
                 "schema": {"type": "string", "pattern": TOKEN_PATTERN}}
_IDEMPOTENCY_HEADER = {"name": IDEMPOTENCY_KEY_HEADER, "in": "header", "required": False,
                       "schema": {"type": "string", "pattern": PRINTABLE_PATTERN, "minLength": 1,
                                  "maxLength": IDEMPOTENCY_KEY_BYTES_MAX}}

_LOCK_CONTENDERS = {  # GET /v1/locks/{scope}/contenders: holder names only, in serving order
    "type": "object",
    "required": ["scope", "contenders"],
    "properties": {"scope": {"type": "string"}, "contenders": {
        "type": "array", "maxItems": CONTENDERS_MAX, "items": {
            "type": "object", "required": ["holder", "holding"],
            "properties": {"holder": {"type": "string"}, "holding": {"type": "boolean"}}}}},
}


def _transaction_schemas(value_bytes_max: int) -> dict[str, Any]:
    """A transaction's body and answer (docs/http-api.md, "Transactions")."""
    key = {"type": "string", "minLength": 1, "maxLength": KEY_BYTES_MAX, "pattern": "^[^\\u0000]+$"}
    put = {"type": "object", "additionalProperties": False, "required": ["op", "key", "value_b64"],
           "properties": {"op": {"const": "put"}, "key": key,
                          "value_b64": {"type": "string", "pattern": BASE64_PATTERN,
                                        "maxLength": 4 * ((value_bytes_max + 2) // 3)}}}
    delete = {"type": "object", "additionalProperties": False, "required": ["op", "key"],
              "properties": {"op": {"const": "delete"}, "key": key}}
    return {
        "TransactionRequest": {
            "type": "object", "additionalProperties": False, "required": ["steps"],
            "properties": {"steps": {"type": "array", "maxItems": TX_WRITES_MAX, "items": {"oneOf": [put, delete]}}},
        },
        "TransactionResult": {
            "type": "object", "required": ["scope", "token_value", "high_water", "commit_seqs"],
            "properties": {"scope": {"type": "string"}, "token_value": {"type": "integer", "minimum": 1},
                           "high_water": {"type": "integer", "minimum": 1},
                           "commit_seqs": {"type": "array", "items": {"type": "integer", "minimum": 1}}},
        },
    }


def _schemas(value_bytes_max: int) -> dict[str, Any]:
    int64 = {"type": "integer", "minimum": 1, "maximum": TOKEN_VALUE_MAX}
    floor = {"type": "integer", "minimum": 0, "maximum": TOKEN_VALUE_MAX}
    lock_info = {
        "type": "object",
        "required": ["scope", "state", "holder", "token", "token_value", "last_token", "remaining_ms", "waiters"],
        "properties": {
            "scope": {"type": "string"},
            "state": {"type": "string", "enum": ["free", "held", "delayed"]},
            "holder": {"type": ["string", "null"]},
            "token": {"type": ["string", "null"]},
            "token_value": {"type": ["integer", "null"]},
            "last_token": {"type": "integer", "minimum": 0},
            "remaining_ms": {"type": "integer", "minimum": 0},
            "waiters": {"type": "integer", "minimum": 0},
        },
    }
    return {
        "Problem": {
            "type": "object",
            "required": ["type", "title", "status"],
            "properties": {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "detail": {"type": "string"},
                "token": {"type": "string"},
                "high_water": {"type": "integer"},
                "reason": {"type": "string"},
                "ticket": {"type": "string", "description": "lock-timeout of a wait until granted: its queue "
                                                            "ticket, to send again (the wait goes on)"},
            },
        },
        "AcquireRequest": {
            "type": "object",
            "additionalProperties": False,
            "required": ["ttl_ms"],
            "properties": {
                "ttl_ms": {"type": "integer", "minimum": TTL_MS_MIN, "maximum": TTL_MS_MAX},
                "wait_ms": {"type": ["integer", "null"], "minimum": WAIT_MS_MIN, "maximum": WAIT_MS_MAX, "default": 0,
                            "description": "null: wait until granted, with a ticket; each request waits at most "
                                           "the server's cap, then 409 lock-timeout with the ticket, and the "
                                           "next request with it continues at the same place in the queue"},
                "ticket": {"type": "string", "pattern": TICKET_PATTERN,
                           "description": "the queue ticket of a wait until granted: drawn at random by the "
                                          "client, sent with every request of the wait"},
                "holder": {"type": "string", "pattern": PRINTABLE_PATTERN, "minLength": 1,
                           "maxLength": HOLDER_BYTES_MAX},
            },
            # wait_ms null goes with a ticket, and a ticket with wait_ms null.
            "allOf": [
                {"if": {"required": ["wait_ms"], "properties": {"wait_ms": {"type": "null"}}},
                 "then": {"required": ["ticket"]}},
                {"if": {"required": ["ticket"]},
                 "then": {"required": ["wait_ms"], "properties": {"wait_ms": {"type": "null"}}}},
            ],
        },
        "RenewRequest": {"type": "object", "additionalProperties": False, "properties": {}},
        "Grant": {
            "type": "object",
            "required": ["scope", "token", "token_value", "lease_id", "ttl_ms"],
            "properties": {"scope": {"type": "string"}, "token": {"type": "string"}, "token_value": int64,
                           "lease_id": {"type": "string"}, "ttl_ms": {"type": "integer"}},
        },
        "Renewal": {
            "type": "object",
            "required": ["scope", "token", "token_value", "ttl_ms"],
            "properties": {"scope": {"type": "string"}, "token": {"type": "string"}, "token_value": int64,
                           "ttl_ms": {"type": "integer"}},
        },
        "LockInfo": lock_info,
        "LockHistory": {
            "type": "object",
            "required": ["scope", "events"],
            "properties": {"scope": {"type": "string"}, "events": {"type": "array", "maxItems": 100, "items": {
                "type": "object",
                "required": ["seq", "scope", "kind", "holder", "token_value", "at_unix_ms", "detail"],
                "properties": {"seq": int64, "scope": {"type": "string"},
                               "kind": {"enum": ["grant", "release", "expire", "reject"]},
                               "holder": {"type": "string"}, "token_value": int64, "at_unix_ms": int64,
                               "detail": {"type": "string"}}}}},
        },
        "LockList": {
            "type": "object",
            "required": ["locks", "next_after"],
            "properties": {"locks": {"type": "array", "items": lock_info},
                           "next_after": {"type": ["string", "null"]}},
        },
        "WriteResult": {
            "type": "object",
            "required": ["scope", "key", "token_value", "high_water", "commit_seq", "replayed"],
            "properties": {"scope": {"type": "string"}, "key": {"type": "string"}, "token_value": int64,
                           "high_water": int64, "commit_seq": {"type": "integer", "minimum": 1},
                           "replayed": {"type": "boolean"}},
        },
        "ItemList": {
            "type": "object",
            "required": ["items", "next_after"],
            "properties": {
                "items": {"type": "array", "items": {
                    "type": "object", "required": ["key", "token_value", "commit_seq", "size"],
                    "properties": {"key": {"type": "string"}, "token_value": int64,
                                   "commit_seq": {"type": "integer"}, "size": {"type": "integer", "minimum": 0}}}},
                "next_after": {"type": ["string", "null"]},
            },
        },
        "HighWater": {"type": "object", "required": ["scope", "high_water"],
                      "properties": {"scope": {"type": "string"}, "high_water": {"type": "integer", "minimum": 0}}},
        "Cluster": {"type": "object", "required": ["cluster_id"],
                    "properties": {"cluster_id": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
                                   "dense_tokens": {"type": "boolean"}}},
        "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
        "FenceFloors": {"type": "object", "required": ["floors", "default"],
                        "properties": {"floors": {"type": "object", "additionalProperties": floor},
                                       "default": floor}},
        "Keyring": {"type": "object", "required": ["kind", "version", "cluster_id", "keys"],
                    "properties": {"kind": {"const": "stockade-keyring"}, "version": {"const": 1},
                                   "cluster_id": {"type": "string"},
                                   "keys": {"type": "array", "items": {"type": "object"}}}},
        **_transaction_schemas(value_bytes_max),
    }


_PATH_PARAMS = {"scope": _SCOPE_PARAM, "lease_id": _LEASE_PARAM, "key": _KEY_PARAM}
_HISTORY_LIMIT = {"name": "limit", "in": "query", "required": False,  # GET /v1/locks/{scope}/history
                  "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 100}}
_CONTENDERS_LIMIT = {"name": "limit", "in": "query", "required": False,  # GET /v1/locks/{scope}/contenders
                     "schema": {"type": "integer", "minimum": 1, "maximum": CONTENDERS_MAX,
                                "default": CONTENDERS_MAX}}
_QUERY_PARAMS = {("after", "scope"): _AFTER_SCOPE, ("after", "key"): _AFTER_KEY, ("limit", "limit"): _LIMIT,
                 ("limit", "history-limit"): _HISTORY_LIMIT, ("limit", "contenders-limit"): _CONTENDERS_LIMIT}
_HEADER_PARAMS = {FENCING_TOKEN_HEADER: _TOKEN_HEADER, IDEMPOTENCY_KEY_HEADER: _IDEMPOTENCY_HEADER}

# What a client does next with an answer (OpenAPI links, by operation id): a grant's lease id renews
# and releases it, its token writes to its scope; a write's key is read back and deleted with the
# same token. A reader follows them; a stateful fuzzer chains requests along them.
_LEASE_ID = {"lease_id": "$response.body#/lease_id"}
_GRANTED = {"scope": "$response.body#/scope", f"header.{FENCING_TOKEN_HEADER}": "$response.body#/token"}
_WRITTEN = {"scope": "$response.body#/scope", "key": "$response.body#/key"}
_SCOPE = {"scope": "$response.body#/scope"}
_LINKS: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
    "acquire": {"Renew": ("renew", _LEASE_ID), "Release": ("release", _LEASE_ID), "Put": ("put", _GRANTED),
                "Transaction": ("transaction", _GRANTED), "Inspect": ("inspectLock", _SCOPE)},
    "put": {"Get": ("get", _WRITTEN), "HighWater": ("highWater", _SCOPE),
            "Delete": ("deleteKey", {**_WRITTEN, f"header.{FENCING_TOKEN_HEADER}":
                                     f"$request.header.{FENCING_TOKEN_HEADER}"})},
}


def _success(route: Route) -> dict[str, Any]:
    description = route.answer_description
    if route.answer == "json":
        if route.answer_schema:
            return _json(description, route.answer_schema)
        return {"description": description, "content": {JSON: {"schema": {"type": "object"}}}}
    if route.answer == "text":
        return {"description": description, "content": {"text/plain; version=0.0.4": {"schema": {"type": "string"}}}}
    if route.answer == "html":
        return {"description": description, "content": {"text/html": {"schema": {"type": "string"}}}}
    if route.answer == "bytes":
        return {"description": description,
                "headers": {TOKEN_VALUE_HEADER: {"required": True, "schema": {"type": "integer"}},
                            COMMIT_SEQ_HEADER: {"required": True, "schema": {"type": "integer"}}},
                "content": {OCTETS: {"schema": {"type": "string", "format": "binary"}}}}
    return {"description": description}


def _operation(route: Route, *, auth: bool, value_bytes_max: int) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": route.operation_id}
    if route.summary:
        operation["summary"] = route.summary
    if route.description:
        operation["description"] = route.description
    if not route.auth:
        operation["security"] = []
    parameters = [_PATH_PARAMS[name] for name in route.path_params]
    parameters += [_QUERY_PARAMS[name_kind] for name_kind in route.query]
    parameters += [_HEADER_PARAMS[name] for name, _ in route.headers]
    if parameters:
        operation["parameters"] = parameters
    if route.body == "json":
        operation["requestBody"] = {"required": route.body_required, "content": {JSON: {
            "schema": {"$ref": f"#/components/schemas/{route.body_schema}"}}}}
    elif route.body == "bytes":
        operation["requestBody"] = {
            "required": route.body_required,
            "description": "The value's bytes as they are; any Content-Type is accepted and none is stored.",
            "content": {OCTETS: {"schema": {"type": "string", "format": "binary", "maxLength": value_bytes_max}}},
        }
    responses = {str(route.status): _success(route)}
    if route.operation_id in _LINKS:
        responses[str(route.status)]["links"] = {
            name: {"operationId": target, "parameters": parameters}
            for name, (target, parameters) in _LINKS[route.operation_id].items()}
    for answer in route.problems:
        responses[str(answer.status)] = _problem(answer.description)
    if auth and route.auth:
        responses["401"] = _problem("Missing or wrong bearer token.")
    operation["responses"] = responses
    return operation


def openapi_document(*, auth: bool, value_bytes_max: int) -> dict[str, Any]:
    """The document for a server with or without bearer-token auth: every route of `ROUTES`, in table order."""
    paths: dict[str, Any] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(
            route, auth=auth, value_bytes_max=value_bytes_max)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "stockade", "version": API_VERSION,
                 "description": "Leases with fencing tokens, and a fenced key-value store. See docs/http-api.md."},
        "paths": paths,
        "components": {"schemas": {**_schemas(value_bytes_max), "LockContenders": _LOCK_CONTENDERS}},
    }
    if auth:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document
