"""Strict input parsing for the server's handlers (docs/http-api.md, "Limits" and JSON rules).

Every handler parses its whole input through these before it touches state,
so a rejected request changes nothing. A bad value raises `InvalidArgument`
(400); a bad field of a well-formed JSON body raises `BodyField` (422); a
protocol-level problem (wrong content type, wrong method) raises `Problem`.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote_to_bytes

from stockade.core.errors import InvalidArgument, LimitExceeded
from stockade.core.limits import LIST_PAGE_MAX, validate_int
from stockade.server._http import Request
from stockade.wire.codecs import JSON

__all__ = ["Problem", "BodyField", "json_object", "media_type", "fields", "segment", "query", "page_limit", "header"]


class Problem(Exception):
    """A protocol-level problem raised by a handler (404, 405, 415): its code is in `stockade.wire.problems`."""

    def __init__(self, code: str, detail: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.headers = headers


class BodyField(Exception):
    """Wraps an error about a field of a well-formed JSON body: `InvalidArgument` (answered 422),
    or `LimitExceeded` for a field over its size bound (answered 413)."""

    def __init__(self, error: InvalidArgument | LimitExceeded) -> None:
        super().__init__(str(error))
        self.error = error


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise InvalidArgument("body", f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise InvalidArgument("body", f"{name} is not JSON")


# An exponent past this cannot be a bound of any field: such a number stays a float (and is refused).
_INTEGRAL_DIGITS_MAX = 20


def _number(text: str) -> int | float:
    """A JSON number with a fraction or an exponent: an int when its value is one, else a float.

    JSON Schema counts ``236.0`` and ``2.36e2`` as integers, and the OpenAPI
    document says "integer": the server takes what the document says it takes.
    The value is read exactly (as a decimal), so ``9007199254740993.0`` is not
    rounded through a float, and a huge exponent is never expanded.
    """
    from decimal import Decimal  # here: clients send integers, and a server's start need not load decimal

    number = Decimal(text)
    if number.adjusted() <= _INTEGRAL_DIGITS_MAX and number == number.to_integral_value():
        return int(number)
    return float(number)


# One strict decoder for every body: ``json.loads`` with these hooks builds a decoder (and its scanner) per call.
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_number)
# What `_DECODER.decode` runs between skipping whitespace before and after the document.
_scan = _DECODER.scan_once  # type: ignore[attr-defined]


def _decode(text: str) -> Any:
    """``_DECODER.decode(text)``: a body that is an object alone, with no space around it (what clients send),
    scanned at once; any other body, and any error, through the decoder's own path (its errors)."""
    if text[:1] == "{" and text[-1:] == "}":
        try:
            document, end = _scan(text, 0)
        except StopIteration:
            return _DECODER.decode(text)
        if end == len(text):
            return document
    return _DECODER.decode(text)


def json_object(request: Request, *, optional: bool) -> dict[str, Any]:
    """Parse a JSON object body strictly (no duplicate keys, no NaN/Infinity, UTF-8 only).

    Raises:
        Problem: wrong content type (415).
        InvalidArgument: not a well-formed JSON object (400).
    """
    body = request.body
    content_type = request.headers.get("content-type")
    if "content-type" in request.repeated:
        raise InvalidArgument("content-type", "must be given once")
    if not body and optional:
        # An empty body carries nothing, whatever its label: curl's -d '' says
        # application/x-www-form-urlencoded, and a renew must not fail on that.
        return {}
    if content_type != JSON and (content_type is None or media_type(content_type) != JSON):
        raise Problem("unsupported-media-type",
                      "the body must be JSON with Content-Type: application/json (curl --json, or -H)")
    try:
        document = _decode(body.decode("utf-8"))
    except InvalidArgument:
        raise
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument("body", f"not well-formed JSON: {type(exc).__name__}") from None
    if type(document) is not dict and not isinstance(document, dict):  # (the usual case: a dict, without a call)
        raise InvalidArgument("body", "must be a JSON object")
    return document


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def fields(document: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Refuse a field of ``document`` not in ``allowed`` (422)."""
    if document.keys() - allowed:
        unknown = sorted(document.keys() - allowed)
        raise BodyField(InvalidArgument(unknown[0][:40], f"unknown field; allowed: {', '.join(allowed)}"))


def segment(raw: str, field: str) -> str:
    """Percent-decode one path segment (or query value) as strict UTF-8."""
    if raw.isascii() and "%" not in raw:
        return raw  # nothing to decode (a lease id, most scopes): what the decoding below returns for it
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(field, "must be percent-encoded UTF-8") from None


def query(request: Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query parameters, each at most once and each in ``allowed`` (400 otherwise)."""
    params: dict[str, str] = {}
    if not request.query:
        return params
    for part in request.query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name = segment(name.replace("+", " "), "query")
        if name not in allowed:
            raise InvalidArgument("query", f"unknown parameter {name[:40]!r}; allowed: {', '.join(allowed)}")
        if name in params:
            raise InvalidArgument(name, "given more than once")
        params[name] = segment(value.replace("+", " "), name)
    return params


def page_limit(params: dict[str, str]) -> int:
    raw = params.get("limit")
    if raw is None:
        return LIST_PAGE_MAX
    if not raw.isascii() or not raw.isdigit() or len(raw) > 7:
        raise InvalidArgument("limit", f"must be an integer in 1..{LIST_PAGE_MAX}")
    return validate_int("limit", int(raw), 1, LIST_PAGE_MAX)


def header(request: Request, name: str) -> str | None:
    """A request header the handler reads: refused when given twice."""
    if name in request.repeated:
        raise InvalidArgument(name, "must be given once")
    return request.headers.get(name)
