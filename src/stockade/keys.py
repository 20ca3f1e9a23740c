"""The coordinator's keyring file: where the keys that sign tokens live (docs/tokens.md).

One JSON file next to the coordinator file (``dir/coord.db`` -> ``dir/coord.keys``),
mode 0600, created with the coordinator and never shared over the network::

    {"kind": "stockade-keyring", "version": 1, "cluster_id": "…",
     "keys": [{"kid": "…", "secret": "<base64url>", "created_s": 1733097600, "verify_until_s": null}, …]}

`KeyFile` is what a coordinator signs with and what a store verifies with; it
re-reads the file when it changes (a rotation by another process), so a store
that meets a token of a key it does not know yet looks again before it refuses.
`rotate` adds a new current key and keeps the old ones for verification until a
stated time. Creation is atomic (written aside, then linked into place, so two
openers agree on one keyring); a rotation is written aside and renamed over the
file under an exclusive lock.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.core.signing import SECRET_BYTES, Keyring, SigningKey
from stockade.core.tokens import FencingToken

__all__ = [
    "KeyFile", "FixedKeys", "TokenVerifier", "keyring_path", "create_keyring", "load_keyring", "rotate",
    "ephemeral_keyring", "verifier_of", "find_keyring", "ROTATE_GRACE_S_DEFAULT", "KIND",
    "DISCOVERY_FILES_MAX", "save_keyring",
]

KIND = "stockade-keyring"
VERSION = 1
#: How long a key replaced by `rotate` still verifies, by default: a week, well beyond how long
#: a lease is normally held (a token is signed once, when its lease is granted).
ROTATE_GRACE_S_DEFAULT = 7 * 24 * 3600
_FILE_BYTES_MAX = 1 << 20


def keyring_path(coordinator_path: str | os.PathLike[str]) -> Path:
    """The keyring of a coordinator file: the same name with ``.keys`` for its suffix."""
    path = Path(coordinator_path)
    return path.with_name(path.name + ".keys") if path.suffix == ".keys" else path.with_suffix(".keys")


def _new_key(now_s: int) -> SigningKey:
    return SigningKey(secrets.token_hex(4), secrets.token_bytes(SECRET_BYTES), now_s, None)


def ephemeral_keyring(cluster_id: str) -> Keyring:
    """A keyring that lives in this process only (the memory coordinator's)."""
    return Keyring(cluster_id, [_new_key(int(time.time()))])


def _dump(keyring: Keyring) -> bytes:
    doc = {
        "kind": KIND, "version": VERSION, "cluster_id": keyring.cluster_id,
        "keys": [
            {"kid": k.kid, "secret": base64.urlsafe_b64encode(k.secret).decode("ascii"),
             "created_s": k.created_s, "verify_until_s": k.verify_until_s}
            for k in keyring.keys
        ],
    }
    return (json.dumps(doc, indent=1) + "\n").encode("ascii")


def _parse(data: bytes, path: Path) -> Keyring:
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("version") != VERSION:
            raise ValueError("not a stockade keyring")
        keys = [
            SigningKey(k["kid"], base64.urlsafe_b64decode(k["secret"]), int(k["created_s"]),
                       None if k["verify_until_s"] is None else int(k["verify_until_s"]))
            for k in doc["keys"]
        ]
        return Keyring(doc["cluster_id"], keys)
    except (ValueError, KeyError, TypeError, InvalidArgument) as exc:
        raise BackendUnavailable(f"{path} is not a usable stockade keyring: {exc}", certain_no_effect=True) from None


def load_keyring(path: str | os.PathLike[str]) -> Keyring:
    """Read a keyring file.

    Raises:
        BackendUnavailable: it cannot be read or is not a keyring.
    """
    path = Path(path)
    try:
        with open(path, "rb") as file:
            data = file.read(_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise BackendUnavailable(f"cannot read the keyring {path}: {exc.strerror}", certain_no_effect=True) from None
    return _parse(data, path)


def _write_aside(path: Path, data: bytes) -> Path:
    aside = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return aside


def _sync_dir(path: Path) -> None:
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_keyring(path: str | os.PathLike[str], keyring: Keyring) -> Path:
    """Write ``keyring`` to ``path`` (0600; written aside, then renamed over it): a copy for a resource host.

    Raises:
        BackendUnavailable: it cannot be written.
    """
    path = Path(path)
    try:
        aside = _write_aside(path, _dump(keyring))
        os.replace(aside, path)
        _sync_dir(path)
    except OSError as exc:
        raise BackendUnavailable(f"cannot write the keyring {path}: {exc.strerror}", certain_no_effect=True) from None
    return path


def create_keyring(path: str | os.PathLike[str], cluster_id: str) -> Keyring:
    """The keyring at ``path``, created (0600, one new current key) if there is none.

    Two processes creating it at once agree on one file (the loser reads the winner's).

    Raises:
        BackendUnavailable: it cannot be written or read, or belongs to another cluster.
    """
    path = Path(path)
    if not path.exists():
        keyring = Keyring(cluster_id, [_new_key(int(time.time()))])
        try:
            aside = _write_aside(path, _dump(keyring))
            try:
                os.link(aside, path)
                _sync_dir(path)
            except FileExistsError:
                pass
            finally:
                aside.unlink()
        except OSError as exc:
            raise BackendUnavailable(f"cannot create the keyring {path}: {exc.strerror}",
                                     certain_no_effect=True) from None
    keyring = load_keyring(path)
    if keyring.cluster_id != cluster_id:
        raise BackendUnavailable(
            f"the keyring {path} belongs to cluster {keyring.cluster_id}, not {cluster_id}", certain_no_effect=True
        )
    return keyring


def rotate(path: str | os.PathLike[str], *, grace_s: int = ROTATE_GRACE_S_DEFAULT,
           now_s: int | None = None) -> Keyring:
    """Make a new current key; the old current one verifies for ``grace_s`` more seconds.

    Keys whose verification period has ended are dropped from the file.

    Returns:
        The new keyring.
    """
    if not isinstance(grace_s, int) or isinstance(grace_s, bool) or grace_s < 0:
        raise InvalidArgument("grace_s", "must be a non-negative integer")
    path = Path(path)
    now = int(time.time()) if now_s is None else now_s
    while True:
        with open(path, "rb") as locked:
            fcntl.flock(locked, fcntl.LOCK_EX)
            if os.fstat(locked.fileno()).st_ino != os.stat(path).st_ino:
                continue  # another rotation replaced it while we waited: lock the new one
            old = _parse(locked.read(_FILE_BYTES_MAX + 1), path)
            kept = [
                SigningKey(k.kid, k.secret, k.created_s,
                           now + grace_s if k.verify_until_s is None else k.verify_until_s)
                for k in old.keys
                if k.verify_until_s is None or k.verify_until_s > now
            ]
            new_key = _new_key(now)
            while new_key.kid in {k.kid for k in kept}:
                new_key = _new_key(now)
            keyring = Keyring(old.cluster_id, [*kept, new_key])
            aside = _write_aside(path, _dump(keyring))
            os.replace(aside, path)
            _sync_dir(path)
            return keyring


class KeyFile:
    """A keyring file as a coordinator's signer and a store's verifier; follows rotations.

    It looks whether the file changed at most once every `reload_check_s`
    (one ``stat``), and at once when it meets a key id it does not know: a new
    key is used (or accepted) as soon as it is written, a key retired or
    dropped from the file is refused within `reload_check_s`.

    Args:
        path: the keyring file.
        cluster_id: the cluster it must belong to (None: whatever it says).
        now_s: the wall clock (seconds), for keys past their verification period.
    """

    def __init__(self, path: str | os.PathLike[str], cluster_id: str | None = None,
                 now_s: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._now_s = now_s
        self._stamp = self._stat()
        self.keyring = load_keyring(self.path)
        self.cluster_id = self.keyring.cluster_id
        if cluster_id is not None and cluster_id != self.cluster_id:
            raise InvalidArgument("keys", f"the keyring {self.path} belongs to cluster {self.cluster_id}, "
                                          f"not {cluster_id}")
        self._checked = time.monotonic()

    #: Seconds between two looks at the file (a stat) when nothing calls for one sooner.
    reload_check_s = 1.0

    def __repr__(self) -> str:
        return f"KeyFile({str(self.path)!r})"

    def _stat(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self.path)
        except OSError:
            return (0, 0, 0)
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _reload_if_changed(self) -> bool:
        stamp = self._stat()
        if stamp == self._stamp or stamp == (0, 0, 0):
            return False
        keyring = load_keyring(self.path)
        if keyring.cluster_id != self.cluster_id:
            return False  # a keyring of another cluster put in its place: keep the known keys
        self.keyring, self._stamp = keyring, stamp
        return True

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked >= self.reload_check_s:
            self._checked = now
            self._reload_if_changed()

    def sign(self, token: FencingToken) -> FencingToken:
        self._maybe_reload()
        return self.keyring.sign(token)

    def in_force(self) -> tuple[Keyring, float]:
        """The keyring it verifies with now (the file looked at as `why_forged` would) and the wall clock."""
        self._maybe_reload()
        return self.keyring, self._now_s()

    def why_forged(self, token: FencingToken) -> str | None:
        """None when the token verifies; else why not (see `Keyring.verify`)."""
        self._maybe_reload()
        why = self.keyring.verify(token, self._now_s())
        if why == "unknown-key" and self._reload_if_changed():
            why = self.keyring.verify(token, self._now_s())
        return why


class FixedKeys:
    """A keyring held in memory as a signer and a verifier (no file behind it)."""

    def __init__(self, keyring: Keyring, now_s: Callable[[], float] = time.time) -> None:
        self.keyring = keyring
        self.cluster_id = keyring.cluster_id
        self._now_s = now_s

    def __repr__(self) -> str:
        return f"FixedKeys({self.keyring!r})"

    def sign(self, token: FencingToken) -> FencingToken:
        return self.keyring.sign(token)

    def in_force(self) -> tuple[Keyring, float]:
        """The keyring it verifies with and the wall clock (as `KeyFile.in_force`)."""
        return self.keyring, self._now_s()

    def why_forged(self, token: FencingToken) -> str | None:
        return self.keyring.verify(token, self._now_s())


TokenVerifier = KeyFile | FixedKeys


def verifier_of(keys: object, cluster_id: str | None) -> TokenVerifier | None:
    """What a store verifies tokens with: a `KeyFile`, `FixedKeys`, a `Keyring` or a keyring path.

    Raises:
        InvalidArgument: anything else, or keys of another cluster.
    """
    if keys is None:
        return None  # the caller refuses None itself (L2: stockade.resources._verify.check_keys_given)
    if isinstance(keys, Keyring):
        keys = FixedKeys(keys)
    elif isinstance(keys, (str, os.PathLike)):
        keys = KeyFile(keys, cluster_id)
    if not isinstance(keys, (KeyFile, FixedKeys)):
        raise InvalidArgument("keys", f"must be a keyring, a KeyFile or a keyring path, got {type(keys).__name__}")
    if cluster_id is not None and keys.cluster_id != cluster_id:
        raise InvalidArgument("keys", f"belong to cluster {keys.cluster_id}, not {cluster_id}")
    return keys


#: The control of the L2 tests, and nothing else: True brings back the behaviour before L2 (``keys=None``
#: meant unsigned, and discovery that found none or several, or lost its keyring past the first 16
#: files, returned None and the store opened unsigned; no resource remembered verifying, so a later
#: ``keys="unsigned"`` was accepted on one that had verified). Tests set it through
#: `stockade.testing.conformance.fence_keys.legacy_keys`; never set it elsewhere.
LEGACY_NONE_MEANS_UNSIGNED = False

#: Files named ``*.keys`` that keyring discovery reads in one directory; more is refused (named).
DISCOVERY_FILES_MAX = 256


def _legacy_find(directory: Path, cluster_id: str) -> Path | None:
    found = []
    for candidate in sorted(directory.glob("*.keys"))[:16]:
        try:
            if load_keyring(candidate).cluster_id == cluster_id:
                found.append(candidate)
        except BackendUnavailable:
            continue
    return found[0] if len(found) == 1 else None


def find_keyring(directory: str | os.PathLike[str], cluster_id: str) -> Path | None:
    """The one keyring of ``cluster_id`` among the ``*.keys`` files of ``directory`` (a store beside its coordinator).

    Discovery never falls back to checking nothing (L2): none, several, or too
    many files to read is refused, in one line naming what was found and the
    ``keys=`` choice that settles it. (It returns None only under the test
    control `LEGACY_NONE_MEANS_UNSIGNED`, as it did before.)

    Raises:
        InvalidArgument: no keyring of the cluster there, several, or more than
            `DISCOVERY_FILES_MAX` ``*.keys`` files.
    """
    where = Path(directory)
    if LEGACY_NONE_MEANS_UNSIGNED:
        return _legacy_find(where, cluster_id)
    try:
        candidates = sorted(where.glob("*.keys"))
    except OSError as exc:
        candidates, unreadable = [], f" ({where} cannot be listed: {exc.strerror})"
    else:
        unreadable = ""
    choose = "pass keys=<keyring path> (or coord.verify_keys()), or keys='unsigned' to check no MAC (unsafe)"
    if len(candidates) > DISCOVERY_FILES_MAX:
        raise InvalidArgument("keys", f"{len(candidates)} *.keys files in {where}, more than discovery reads "
                                      f"({DISCOVERY_FILES_MAX}): {choose}")
    found: list[str] = []
    others: list[str] = []
    for candidate in candidates:
        try:
            owner = load_keyring(candidate).cluster_id
        except BackendUnavailable:
            owner = "unreadable"
        (found if owner == cluster_id else others).append(f"{candidate.name} ({owner})")
    if len(found) == 1:
        return where / found[0].split(" (")[0]
    seen = ", ".join((found or others)[:4]) + (", ..." if len(found or others) > 4 else "")
    what = (f"{len(found)} keyrings of cluster {cluster_id} in {where}: {seen}" if found else
            f"no keyring of cluster {cluster_id} in {where}{unreadable}"
            + (f" ({len(others)} of other clusters or unreadable: {seen})" if others else ""))
    raise InvalidArgument("keys", f"{what}; {choose}")
