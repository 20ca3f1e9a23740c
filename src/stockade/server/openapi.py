"""The OpenAPI 3.1 document served at ``/openapi.json``: docs/http-api.md as a schema.

The bounds come from `stockade.core.limits`, so the schema and the validators
cannot drift apart. The schema is as strict as the server: whatever it calls
invalid, the server rejects with a 4xx (schemathesis checks both directions).
"""

from __future__ import annotations

from typing import Any

from stockade.core.limits import (
    HOLDER_BYTES_MAX,
    IDEMPOTENCY_KEY_BYTES_MAX,
    KEY_BYTES_MAX,
    LIST_PAGE_MAX,
    SCOPE_BYTES_MAX,
    TOKEN_VALUE_MAX,
    TTL_MS_MAX,
    TTL_MS_MIN,
    WAIT_MS_MAX,
    WAIT_MS_MIN,
)

__all__ = ["openapi_document", "JSON_BODY_BYTES_MAX"]

JSON_BODY_BYTES_MAX = 8 * 1024

SCOPE_PATTERN = f"^[A-Za-z0-9._:-]{{1,{SCOPE_BYTES_MAX}}}$"
LEASE_ID_PATTERN = "^[A-Za-z0-9_-]{16,64}$"
TOKEN_PATTERN = f"^stk1\\.[0-9a-f]{{16}}\\.[1-9][0-9]{{0,17}}\\.[A-Za-z0-9._:-]{{1,{SCOPE_BYTES_MAX}}}$"
PRINTABLE_PATTERN = "^[\\x21-\\x7e]+$"


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def _json(description: str, ref: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


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
_TOKEN_HEADER = {"name": "Fencing-Token", "in": "header", "required": True,
                 "description": "The encoded fencing token, verbatim from acquire.",
                 "schema": {"type": "string", "pattern": TOKEN_PATTERN}}
_IDEMPOTENCY_HEADER = {"name": "Idempotency-Key", "in": "header", "required": False,
                       "schema": {"type": "string", "pattern": PRINTABLE_PATTERN, "minLength": 1,
                                  "maxLength": IDEMPOTENCY_KEY_BYTES_MAX}}

_COMMON_ERRORS = {"400": _problem("Malformed request (bad path, query or header)."),
                  "503": _problem("The coordinator or store file could not be written.")}
_BODY_ERRORS = {"413": _problem("Request body too large."), "415": _problem("Wrong content type."),
                "422": _problem("Well-formed JSON body with a bad field.")}
_WRITE_RESULT_ERRORS = {
    "409": _problem("stale-token (with token and high_water) or token-mismatch (with reason)."),
    "413": _problem("Value too large."),
    "415": _problem("Wrong content type."),
    "429": _problem("A store bound was reached."),
}


def _schemas() -> dict[str, Any]:
    int64 = {"type": "integer", "minimum": 1, "maximum": TOKEN_VALUE_MAX}
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
            },
        },
        "AcquireRequest": {
            "type": "object",
            "additionalProperties": False,
            "required": ["ttl_ms"],
            "properties": {
                "ttl_ms": {"type": "integer", "minimum": TTL_MS_MIN, "maximum": TTL_MS_MAX},
                "wait_ms": {"type": "integer", "minimum": WAIT_MS_MIN, "maximum": WAIT_MS_MAX, "default": 0},
                "holder": {"type": "string", "pattern": PRINTABLE_PATTERN, "minLength": 1,
                           "maxLength": HOLDER_BYTES_MAX},
            },
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
                    "properties": {"cluster_id": {"type": "string", "pattern": "^[0-9a-f]{16}$"}}},
        "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
    }


def openapi_document(*, auth: bool, value_bytes_max: int) -> dict[str, Any]:
    """The document for a server with or without bearer-token auth."""
    value_body = {"required": True, "content": {"application/octet-stream": {
        "schema": {"type": "string", "format": "binary", "maxLength": value_bytes_max}}}}
    paths: dict[str, Any] = {
        "/healthz": {"get": {"operationId": "healthz", "security": [], "summary": "Liveness",
                             "responses": {"200": _json("Both files are open.", "Health")}}},
        "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics", "responses": {
            "200": {"description": "Prometheus text format",
                    "content": {"text/plain; version=0.0.4": {"schema": {"type": "string"}}}}}}},
        "/v1/cluster": {"get": {"operationId": "cluster", "responses": {"200": _json("Cluster id", "Cluster")}}},
        "/v1/locks": {"get": {
            "operationId": "listLocks", "parameters": [_AFTER_SCOPE, _LIMIT],
            "responses": {"200": _json("A page of scopes in name order.", "LockList"), **_COMMON_ERRORS}}},
        "/v1/locks/{scope}": {"get": {
            "operationId": "inspectLock", "parameters": [_SCOPE_PARAM],
            "responses": {"200": _json("The scope's state.", "LockInfo"), **_COMMON_ERRORS}}},
        "/v1/locks/{scope}/acquire": {"post": {
            "operationId": "acquire", "parameters": [_SCOPE_PARAM],
            "description": "Long-polls up to wait_ms; waiters are served first in, first out.",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/AcquireRequest"}}}},
            "responses": {"200": _json("Granted; the token is durable.", "Grant"), **_COMMON_ERRORS, **_BODY_ERRORS,
                          "409": _problem("lock-timeout: still held at the deadline."),
                          "429": _problem("limit-exceeded: queue or lease bound reached.")}}},
        "/v1/leases/{lease_id}/renew": {"post": {
            "operationId": "renew", "parameters": [_LEASE_PARAM],
            "requestBody": {"required": False, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/RenewRequest"}}}},
            "responses": {"200": _json("Renewed for its TTL from now.", "Renewal"), **_COMMON_ERRORS, **_BODY_ERRORS,
                          "410": _problem("not-holder: expired, released, or unknown.")}}},
        "/v1/leases/{lease_id}": {"delete": {
            "operationId": "release", "parameters": [_LEASE_PARAM],
            "responses": {"204": {"description": "Released, or already gone."}, **_COMMON_ERRORS}}},
        "/v1/kv/{scope}": {"get": {
            "operationId": "listKeys", "parameters": [_SCOPE_PARAM, _AFTER_KEY, _LIMIT],
            "responses": {"200": _json("A page of keys in order.", "ItemList"), **_COMMON_ERRORS}}},
        "/v1/kv/{scope}/{key}": {
            "put": {"operationId": "put", "parameters": [_SCOPE_PARAM, _KEY_PARAM, _TOKEN_HEADER, _IDEMPOTENCY_HEADER],
                    "requestBody": value_body,
                    "responses": {"200": _json("Accepted and durable.", "WriteResult"), **_COMMON_ERRORS,
                                  **_WRITE_RESULT_ERRORS}},
            "delete": {"operationId": "deleteKey",
                       "parameters": [_SCOPE_PARAM, _KEY_PARAM, _TOKEN_HEADER, _IDEMPOTENCY_HEADER],
                       "responses": {"200": _json("Accepted and durable.", "WriteResult"), **_COMMON_ERRORS,
                                     **_WRITE_RESULT_ERRORS}},
            "get": {"operationId": "get", "parameters": [_SCOPE_PARAM, _KEY_PARAM],
                    "responses": {
                        "200": {"description": "The value.",
                                "headers": {"Token-Value": {"required": True, "schema": {"type": "integer"}},
                                            "Commit-Seq": {"required": True, "schema": {"type": "integer"}}},
                                "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                    "format": "binary"}}}},
                        "404": _problem("No such key."), **_COMMON_ERRORS}},
        },
        "/v1/hwm/{scope}": {"get": {
            "operationId": "highWater", "parameters": [_SCOPE_PARAM],
            "responses": {"200": _json("The scope's high-water mark (0 if never written).", "HighWater"),
                          **_COMMON_ERRORS}}},
    }
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "stockade", "version": "1",
                 "description": "Leases with fencing tokens, and a fenced key-value store. See docs/http-api.md."},
        "paths": paths,
        "components": {"schemas": _schemas()},
    }
    if auth:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
        for path, item in paths.items():
            for operation in item.values():
                if path != "/healthz":
                    operation["responses"]["401"] = _problem("Missing or wrong bearer token.")
    return document
