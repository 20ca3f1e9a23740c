"""What every part of stockade that talks to PostgreSQL shares: an error in one line, and how text crosses.

**Text and the database's encoding.** psycopg decodes a text column with the
connection's ``client_encoding``, which defaults to the database's encoding.
A ``SQL_ASCII`` database (what ``initdb`` makes under the C/POSIX locale) has
no encoding: psycopg then hands text back as ``bytes``, so an ``int()`` or an
f-string of a value read back is silently wrong (``"b'8'"``). So:

- every connection stockade opens itself (the coordinator's, `PostgresFence`'s,
  the shard log's) asks for ``client_encoding`` `CLIENT_ENCODING` (UTF8) in its
  startup packet, at no cost: a ``SQL_ASCII`` database stores the bytes as
  they are, a UTF8 one is unchanged, and any other server encoding is
  converted by the server (all that stockade stores as text is ASCII: scopes,
  holders, cluster ids, numbers; keys and records are ``bytea``). The one
  server encoding without a conversion to UTF8, MULE_INTERNAL, is refused by
  the server when the connection starts, in one line that names it;
- a value read on a connection the *user* opened (``install(conn)``,
  ``high_waters(conn)``) goes through `text_of`: stockade's own text there
  (cluster ids, scopes, schema names) is ASCII, the same bytes in every encoding.

psycopg raises two errors of its own here that are not ``psycopg.Error``s
of the server: a url whose %-escapes are not UTF-8 (``UnicodeDecodeError``,
turned into `InvalidArgument` by `open_connection`), and a user's connection
in an encoding Python has no codec for (EUC_TW, MULE_INTERNAL:
``NotSupportedError`` without a SQLSTATE, `no_codec`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from stockade.core.errors import InvalidArgument

__all__ = ["CLIENT_ENCODING", "error_text", "no_codec", "open_connection", "text_of"]

T = TypeVar("T")

#: The ``client_encoding`` of every connection stockade opens (a connection parameter: no round trip).
#: None, the database's own, only in the control of tests/test_postgres_encodings.py (the old behaviour).
CLIENT_ENCODING: str | None = "UTF8"


def text_of(value: Any) -> Any:
    """A text value read back from PostgreSQL as ``str``, whatever the connection's encoding (None stays None).

    psycopg returns ``bytes`` for text on a ``SQL_ASCII`` connection; what
    stockade reads back there is ASCII it wrote itself (or UTF-8, which
    psycopg sends on such a connection), so it is decoded as UTF-8.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return value


def open_connection(connect: Callable[..., T], conninfo: str, **kwargs: Any) -> T:
    """``connect(conninfo, **kwargs)`` (``psycopg.connect``) in `CLIENT_ENCODING`, whatever the url says.

    Raises:
        InvalidArgument: the url's %-escapes are not UTF-8 (psycopg raises a bare ``UnicodeDecodeError``).
        psycopg.Error: as ``connect`` does; each caller turns it into its own typed error.
    """
    if CLIENT_ENCODING is not None:
        kwargs["client_encoding"] = CLIENT_ENCODING
    try:
        return connect(conninfo, **kwargs)
    except UnicodeError as exc:
        raise InvalidArgument("url", f"is not UTF-8 once its %-escapes are decoded ({exc})") from exc


def no_codec(exc: BaseException) -> InvalidArgument | None:
    """The error for a connection whose client encoding psycopg cannot decode; None for any other error."""
    if type(exc).__name__ != "NotSupportedError" or getattr(exc, "sqlstate", None) is not None:
        return None
    return InvalidArgument("conn", f"{error_text(exc)}: connect with a client_encoding it has, e.g. UTF8")


def error_text(exc: BaseException) -> str:
    """A psycopg error in one line, for a person: the server's message, its detail and hint, its SQLSTATE.

    Never the server-side statement that raised it (the ``CONTEXT`` lines: a
    function's SQL, which the server's own log keeps): a full disk reads
    ``could not extend file "base/5/16399_fsm": No space left on device
    (hint: Check free disk space.) [SQLSTATE 53100]``. An error without the
    server's fields (a refused connection) is its own text, on one line.
    """
    diag: Any = getattr(exc, "diag", None)
    if diag is None or not diag.message_primary:
        return " ".join(str(exc).split()) or type(exc).__name__
    text = str(diag.message_primary)
    if diag.message_detail:
        text += f"; {diag.message_detail}"
    if diag.message_hint:
        text += f" (hint: {diag.message_hint})"
    if diag.sqlstate:
        text += f" [SQLSTATE {diag.sqlstate}]"
    return " ".join(text.split())
