"""A PostgreSQL error as one line for a person, for every part of stockade that talks to PostgreSQL."""

from __future__ import annotations

from typing import Any

__all__ = ["error_text"]


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
