"""A pure-Python HTTP/1.1 request parser: the server's on the base install (no ``httptools``).

It drives the same callbacks as ``httptools.HttpRequestParser`` (``on_message_begin``,
``on_url``, ``on_header``, ``on_headers_complete``, ``on_body``,
``on_message_complete``) and answers ``get_method``, ``should_keep_alive`` and
``should_upgrade`` as it does, so `stockade.server._http.HttpProtocol` runs on
either; `PARSERS` names both and `make_parser` picks one. The grammar is RFC 9112's,
strictly, and where llhttp (httptools' parser) refuses a request this one
refuses it too (tests/test_server_parsers.py feeds both the same bytes):

- request line ``METHOD SP target SP HTTP/1.1`` (or ``HTTP/1.0``), one space
  each; a method of llhttp's list (`METHODS`); a target of visible bytes;
- header lines ``name: value``: a token name, no space before the colon, a
  value without control bytes but tab (spaces and tabs around it dropped); no
  line folding; every line ends with CRLF (a bare LF or CR is refused);
- the body: ``Transfer-Encoding`` ending in ``chunked`` (chunk sizes in hex,
  extensions ignored, trailer lines given to ``on_header`` as llhttp does), or
  one ``Content-Length`` of digits, or none; both, two lengths, or another
  transfer coding are refused;
- keep-alive as HTTP/1.1 says: on unless ``Connection: close`` (HTTP/1.0: off
  unless ``Connection: keep-alive``); empty lines before a request are skipped.

What a head may hold is bounded here as the protocol bounds it: `URL_BYTES_MAX`
bytes of target (414), and, before the header lines are complete, at most
`HEAD_BYTES_MAX` bytes of them (431) — the protocol counts `HEADERS_MAX` headers
and `HEADER_BYTES_MAX` bytes of names and values once they are parsed. A
refusal is a `ParseError` carrying its status, problem code and detail; the
parser is then spent (the connection closes).
"""

from __future__ import annotations

import re
from typing import Any

from stockade.transport.http11 import CHUNK_SIZE_LINE, FIELD_LINE

__all__ = [
    "HEADERS_MAX", "HEADER_BYTES_MAX", "HEAD_BYTES_MAX", "METHODS", "PARSERS", "URL_BYTES_MAX", "ParseError",
    "ParseUpgrade", "RequestParser", "make_parser", "split_target",
]

URL_BYTES_MAX = 8 * 1024
HEADERS_MAX = 64
HEADER_BYTES_MAX = 16 * 1024
#: The header lines of one head with their separators, before they are parsed: the names and values'
#: bound, and 8 bytes per header for ``: ``, CRLF and a little padding.
HEAD_BYTES_MAX = HEADER_BYTES_MAX + 8 * HEADERS_MAX
HEADERS_DETAIL = f"at most {HEADERS_MAX} headers and {HEADER_BYTES_MAX} bytes of them"
URL_DETAIL = f"URL longer than {URL_BYTES_MAX} bytes"
MALFORMED = "malformed HTTP request"

#: llhttp's request methods (HTTP mode); any other is a malformed request under either parser.
METHODS = frozenset(m.encode() for m in (
    "DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND PROPPATCH SEARCH UNLOCK BIND "
    "REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH NOTIFY SUBSCRIBE UNSUBSCRIBE PATCH PURGE "
    "MKCALENDAR LINK UNLINK SOURCE QUERY"
).split())
_METHOD_PREFIXES = frozenset(m[:i] for m in METHODS for i in range(1, len(m) + 1))
_METHOD_LENGTH_MAX = max(map(len, METHODS))
#: llhttp's versions: 0.9 (no version) and 2.0 are parsed, and refused by the protocol (both parsers).
_VERSIONS = frozenset({(b"1", b"1"), (b"1", b"0"), (b"0", b"9"), (b"2", b"0")})

_REQUEST_LINE = re.compile(rb"([A-Z-]+) +([\x21-\x7e]+)(?: +HTTP/([0-9])\.([0-9]))?")
#: What may still become a request line, and a header line, once more bytes come.
_PARTIAL_REQUEST_LINE = re.compile(
    rb"[A-Z-]*(?: +(?:[\x21-\x7e]+(?: +(?:H(?:T(?:T(?:P(?:/(?:[0-9](?:\.[0-9]?)?)?)?)?)?)?)?)?)?)?")
_PARTIAL_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]*)(?::([\t\x20-\x7e\x80-\xff]*))?")
_PARTIAL_DIGITS = re.compile(rb"[ \t]*[0-9]*[ \t]*")
_TARGET_START = re.compile(rb"/|\*$|[A-Za-z][A-Za-z0-9+.-]*://")
_FIELD = FIELD_LINE  # `stockade.transport.http11`'s, as the client reads them
_CHUNK_SIZE = CHUNK_SIZE_LINE
_DIGITS = re.compile(rb"[0-9]{1,20}")

# states
_HEAD, _BODY, _CHUNK_SIZE_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILERS = range(6)

#: The names of the parsers `make_parser` builds: "httptools" needs that package.
PARSERS = ("httptools", "python")


class ParseError(Exception):
    """A request the parser refuses: its status, problem code and detail."""

    def __init__(self, detail: str = MALFORMED, *, status: int = 400, code: str = "invalid-argument") -> None:
        super().__init__(detail)
        self.status = status
        self.code = code


class ParseUpgrade(ParseError):
    """A request for another protocol (``CONNECT``, or ``Connection: upgrade`` with ``Upgrade``)."""


def _malformed() -> ParseError:
    return ParseError()


def split_target(url: bytes) -> tuple[str, str]:
    """The path and query of a request target (origin form ``/p?q``, or absolute form ``http://h/p?q``).

    Raises:
        ParseError: any other form.
    """
    if url[:1] != b"/":
        scheme, sep, rest = url.partition(b"://")
        if not sep or scheme.lower() not in (b"http", b"https") or not rest or rest[:1] in b"/?#":
            raise ParseError("malformed request target")
        slash = rest.find(b"/")
        url = rest[slash:] if slash >= 0 else b"/"
    if b"?" not in url and b"#" not in url:  # the usual target: a path alone (what the line below makes of it)
        return (url or b"/").decode("latin-1"), ""
    path, _, query = url.partition(b"#")[0].partition(b"?")
    return (path or b"/").decode("latin-1"), query.decode("latin-1")


class RequestParser:
    """Requests from a byte stream, to ``protocol``'s callbacks (httptools' interface)."""

    __slots__ = ("_protocol", "_buf", "_state", "_begun", "_method", "_keep_alive", "_upgrade", "_remaining",
                 "_failed", "_trailer_bytes", "_version")

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol
        self._buf = b""
        self._state = _HEAD
        self._begun = False
        self._method = b""
        self._keep_alive = True
        self._upgrade = False
        self._remaining = 0
        self._failed = False
        self._trailer_bytes = 0
        self._version = (b"1", b"1")

    def get_http_version(self) -> str:
        return f"{self._version[0].decode()}.{self._version[1].decode()}"

    def get_method(self) -> bytes:
        return self._method

    def should_keep_alive(self) -> bool:
        return self._keep_alive

    def should_upgrade(self) -> bool:
        return self._upgrade

    def feed_data(self, data: bytes) -> None:
        """Parse ``data``, calling back for each part of each request it completes.

        Raises:
            ParseError: the bytes are not a request this parser takes (it is spent).
            Exception: whatever a callback raised (the parser is spent).
        """
        if self._failed:
            raise _malformed()
        buf = self._buf + data if self._buf else data
        pos = 0
        try:
            while pos < len(buf):
                state = self._state
                if state == _HEAD:
                    pos = self._head(buf, pos)
                elif state == _BODY:
                    pos = self._body(buf, pos)
                elif state == _CHUNK_DATA:
                    pos = self._chunk_data(buf, pos)
                elif state == _CHUNK_SIZE_LINE:
                    pos = self._chunk_size(buf, pos)
                elif state == _CHUNK_END:
                    pos = self._chunk_end(buf, pos)
                else:
                    pos = self._trailer(buf, pos)
                if pos < 0:
                    pos = -pos - 1  # incomplete: keep the rest for the next feed
                    break
        except BaseException:
            self._failed = True
            self._buf = b""
            raise
        self._buf = buf[pos:]

    # -- the head ----------------------------------------------------------------------------

    def _head(self, buf: bytes, pos: int) -> int:
        if not self._begun:
            while pos < len(buf) and buf[pos] in b"\r\n":
                pos += 1  # empty lines before a request
            if pos == len(buf):
                return -pos - 1
            self._begun = True
            self._protocol.on_message_begin()
        end = buf.find(b"\r\n\r\n", pos)
        if end < 0:
            self._check_partial_head(buf, pos)
            return -pos - 1
        lines = buf[pos:end].split(b"\r\n")
        if end - pos - len(lines[0]) > HEAD_BYTES_MAX:
            raise ParseError(HEADERS_DETAIL, status=431, code="limit-exceeded")
        self._request_line(lines[0])
        self._headers(lines)
        self._protocol.on_headers_complete()
        if self._upgrade:
            raise ParseUpgrade("protocol upgrade is not supported")
        if self._state == _HEAD:
            self._complete()
        return end + 4

    def _check_partial_head(self, buf: bytes, pos: int) -> None:
        """Refuse an incomplete head as soon as what came of it cannot begin a request (llhttp does)."""
        rest = buf[pos:-1] if buf.endswith(b"\r") else buf[pos:]  # a CR that may begin a CRLF
        if b"\n" in rest.replace(b"\r\n", b"") or b"\r" in rest.replace(b"\r\n", b""):
            raise _malformed()  # a bare LF or CR
        lines = rest.split(b"\r\n")
        if len(lines) == 1:  # the request line so far
            if _PARTIAL_REQUEST_LINE.fullmatch(lines[0]) is None:
                raise _malformed()
            method = lines[0].partition(b" ")[0]
            if method not in (_METHOD_PREFIXES if method == lines[0] else METHODS):
                raise _malformed()
            if len(lines[0]) > len(method) + URL_BYTES_MAX + 10:  # the target, its spaces and HTTP/1.1
                raise ParseError(URL_DETAIL, status=414, code="limit-exceeded")
            return
        if len(rest) - len(lines[0]) > HEAD_BYTES_MAX:
            raise ParseError(HEADERS_DETAIL, status=431, code="limit-exceeded")
        self._request_line(lines[0], dry=True)
        self._headers(lines[:-1], dry=True)
        field = _PARTIAL_FIELD.fullmatch(lines[-1])
        if field is None or (field.group(1).lower() == b"content-length" and field.group(2) is not None
                             and not _PARTIAL_DIGITS.fullmatch(field.group(2))):
            raise _malformed()

    def _request_line(self, line: bytes, dry: bool = False) -> None:
        parts = _REQUEST_LINE.fullmatch(line)
        if parts is None or parts.group(1) not in METHODS:
            raise _malformed()
        method, target = parts.group(1, 2)
        if method != b"CONNECT" and not _TARGET_START.match(target):  # CONNECT: host:port
            raise _malformed()
        version = parts.group(3, 4) if parts.group(3) else (b"0", b"9")
        if version not in _VERSIONS:
            raise _malformed()
        if dry:
            return
        self._method = method
        self._version = version
        self._keep_alive = version == (b"1", b"1")
        self._upgrade = method == b"CONNECT"
        self._protocol.on_url(target)  # the protocol bounds its length (414)

    def _headers(self, lines: list[bytes], dry: bool = False) -> None:
        """The header lines after the request line ``lines[0]``: checked, framed, and given to ``on_header``."""
        on_header = self._protocol.on_header
        length: int | None = None
        chunked = connection_upgrade = upgrade = False
        http11 = self._version == (b"1", b"1")
        for line in lines[1:]:
            field = _FIELD.fullmatch(line)
            if field is None:
                raise _malformed()
            name, value = field.groups()
            lower = name.lower()
            if lower == b"content-length":
                if length is not None or chunked or not _DIGITS.fullmatch(value) or int(value) >= 1 << 64:
                    raise _malformed()
                length = int(value)
            elif lower == b"transfer-encoding":
                if length is not None or chunked:  # chunked is the last coding: nothing after it
                    raise _malformed()
                codings = [c.strip().lower() for c in value.split(b",")]
                chunked = codings[-1] == b"chunked" and b"chunked" not in codings[:-1]
                if not chunked:
                    raise _malformed()
            elif lower == b"connection" and not dry:
                tokens = {t.strip().lower() for t in value.split(b",")}
                if http11 and b"close" in tokens:
                    self._keep_alive = False
                elif not http11 and b"keep-alive" in tokens:
                    self._keep_alive = True
                connection_upgrade = connection_upgrade or b"upgrade" in tokens
            elif lower == b"upgrade":
                upgrade = True
            if not dry:
                on_header(name, value)
        if dry:
            return
        if connection_upgrade and upgrade:
            self._upgrade = True
        if chunked:
            self._state = _CHUNK_SIZE_LINE
        elif length:
            self._state, self._remaining = _BODY, length

    # -- the body ----------------------------------------------------------------------------

    def _body(self, buf: bytes, pos: int) -> int:
        take = min(self._remaining, len(buf) - pos)
        self._remaining -= take
        self._protocol.on_body(buf[pos:pos + take] if pos or take < len(buf) else buf)
        if not self._remaining:
            self._complete()
        return pos + take

    def _chunk_size(self, buf: bytes, pos: int) -> int:
        end = buf.find(b"\r\n", pos)
        if end < 0:
            if len(buf) - pos > 1024 or b"\n" in buf[pos:]:
                raise _malformed()
            return -pos - 1
        size = _CHUNK_SIZE.fullmatch(buf, pos, end)
        if size is None:
            raise _malformed()
        self._remaining = int(size.group(1), 16)
        self._state = _CHUNK_DATA if self._remaining else _TRAILERS
        self._trailer_bytes = 0
        return end + 2

    def _chunk_data(self, buf: bytes, pos: int) -> int:
        take = min(self._remaining, len(buf) - pos)
        self._remaining -= take
        self._protocol.on_body(buf[pos:pos + take])
        if not self._remaining:
            self._state = _CHUNK_END
        return pos + take

    def _chunk_end(self, buf: bytes, pos: int) -> int:
        if len(buf) - pos < 2:
            if buf[pos:] != b"\r":
                raise _malformed()
            return -pos - 1
        if buf[pos:pos + 2] != b"\r\n":
            raise _malformed()
        self._state = _CHUNK_SIZE_LINE
        return pos + 2

    def _trailer(self, buf: bytes, pos: int) -> int:
        end = buf.find(b"\r\n", pos)
        if end < 0:
            if len(buf) - pos + self._trailer_bytes > HEAD_BYTES_MAX:
                raise ParseError(HEADERS_DETAIL, status=431, code="limit-exceeded")
            rest = buf[pos:-1] if buf.endswith(b"\r") else buf[pos:]
            if b"\n" in rest or b"\r" in rest:
                raise _malformed()  # a bare LF or CR
            return -pos - 1
        if end == pos:
            self._complete()
            return pos + 2
        field = _FIELD.fullmatch(buf, pos, end)
        if field is None:
            raise _malformed()
        self._trailer_bytes += end - pos + 2
        self._protocol.on_header(*field.groups())
        return end + 2

    def _complete(self) -> None:
        self._state = _HEAD
        self._begun = False
        self._protocol.on_message_complete()


def make_parser(name: str | None) -> Any:
    """The parser class named ``name`` (one of `PARSERS`); None: httptools' when installed, else this module's.

    Raises:
        ImportError: ``httptools`` was asked for and is not installed.
    """
    if name == "python":
        return RequestParser
    try:
        import httptools
    except ImportError:
        if name == "httptools":
            raise
        return RequestParser
    return httptools.HttpRequestParser
