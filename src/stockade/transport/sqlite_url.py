"""How a ``sqlite://`` url names a file: the convention SQLAlchemy uses, in every place stockade takes one.

- ``sqlite:///app/coord.db`` is the relative path ``app/coord.db`` (from the working directory);
- ``sqlite:////srv/app/coord.db`` is the absolute path ``/srv/app/coord.db``.

So a url written for a SQLAlchemy engine names the same file when given to stockade,
and the SQLite fence and the embedded coordinator can be configured side by side.

Development versions before 0.1.0 read ``sqlite:////srv/app/coord.db`` as absolute and
``sqlite:///app/coord.db`` as relative. A url that reads differently now is never moved
silently: ``sqlite:///app/coord.db`` (a host part) is refused, and so is
``sqlite:////srv/app/coord.db`` when ``srv/app`` does not exist under the working
directory but ``/srv/app`` does — each with one line that says how to write it.
"""

from __future__ import annotations

import os
from pathlib import Path

from stockade.core.errors import InvalidArgument

__all__ = ["sqlite_path", "sqlite_url"]

SCHEME = "sqlite://"


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The ``sqlite://`` url of a file: ``sqlite:///`` and the path (a fourth slash when it is absolute)."""
    return f"{SCHEME}/{os.fspath(path)}"


def sqlite_path(url: str, field: str = "url") -> Path:
    """The file a ``sqlite://`` url names (relative paths from the working directory).

    Raises:
        InvalidArgument: no path, a host part, a NUL, or an old-style absolute url (module docstring).
    """
    rest = url[len(SCHEME):] if url.startswith(SCHEME) else url
    if "\x00" in rest:
        raise InvalidArgument(field, "a sqlite url must not hold a NUL character")
    if not rest.startswith("/"):
        hint = f": write sqlite:///{rest} for the relative path {rest}" if rest else ""
        raise InvalidArgument(field, f"a sqlite url has no host part, only a path{hint} "
                                     "(sqlite:///relative/path.db or sqlite:////absolute/path.db)")
    path = rest[1:]
    if not path or path.endswith("/"):
        raise InvalidArgument(field, f"sqlite url needs a file path: {SCHEME}/relative/file.db "
                                     f"or {SCHEME}//absolute/file.db")
    if not path.startswith("/"):
        _refuse_old_absolute(path, field)
    return Path(path)


def _refuse_old_absolute(path: str, field: str) -> None:
    """Refuse a relative path that the old convention read as absolute, when that names another file."""
    absolute = Path("/" + path)
    relative = Path(path)
    if relative.exists() or absolute.resolve() == relative.resolve():
        return
    moved = absolute.exists() or (relative.parent != Path(".") and not relative.parent.exists()
                                  and absolute.parent.is_dir())
    if moved:
        raise InvalidArgument(field, f"sqlite:///{path} is the relative path {path} (from {Path.cwd()}), "
                                     f"which does not exist, but /{path} {'does' if absolute.exists() else 'could'}: "
                                     f"write sqlite:////{path} for the absolute path")
