"""Renewals beside the coordinator file: one small file per lease, written without any lock.

A renewal in the coordinator file is a write transaction, and SQLite lets one
process write at a time: a process frozen inside any write transaction would
stop every other holder's renewals, and their leases would be lost (K2). So the
process that holds a lease renews it by writing "renewed until" into the
lease's own file here, ``PATH.renew/BOOT/HASH`` (16 bytes, no fsync), and every
unit that loads the lease reads it: the lease's deadline is the later of the
stored one and the file's.

Why a renewal and an expiry decided at the same moment cannot both succeed
(C2), with no lock between them: an expirer reads its clock (``now``) before
it reads the file, and expires the lease only if what it read is ``<= now``.
The renewer writes the file, then reads its clock (``after``), and counts the
renewal as refused if ``after`` is at or past the deadline it renewed from
(``E``). If the expirer's read missed the write, the read came first, so
``E <= now <= read < write < after``: the renewal is refused. Both clocks are
the host's one monotonic clock (the coordinator refuses processes on another,
docs/coordinator-files.md "Time namespaces"). A read that sees half a write is
recognised (each value is stored with its complement) and read again.

Why no fsync: a process that dies leaves its write in the page cache, where
the next reader finds it; a host crash loses it, but a host crash is a reboot,
and after a reboot every lease that was held gets a full TTL from the first
open (C3). The files of a boot live under that boot's directory, so the
times of a past boot (another clock) are never read.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from stockade.core.engine import LeaseEngine, Outcome
from stockade.core.errors import BackendUnavailable, NotHolder
from stockade.core.leases import AcquireRequest, Granted, Lease, Released, lease_hint

__all__ = ["RenewalFiles", "RenewingEngine"]

_RECORD = struct.Struct("<qq")  # (renewed until, its complement): a torn read does not match
_ENDED_AT = _RECORD.size  # one byte after the record: set by whoever ends the lease (release, expiry)
_ENDED = b"\x01"
_MASK = (1 << 64) - 1
_HELD_PRUNE_AT = 4_096  # remembered leases of one engine past which the expired ones are forgotten
_TORN_READS_MAX = 10_000  # a write is one pwrite of 16 bytes; a reader never waits long for it


def _complement(value: int) -> int:
    return int(struct.unpack("<q", struct.pack("<Q", ~value & _MASK))[0])


class RenewalFiles:
    """The renewal files of one coordinator file, for the current boot.

    Args:
        path: the coordinator file.
        boot: the boot id (`stockade.coordinators.sqlite._file.boot_id`).
    """

    def __init__(self, path: Path, boot: str) -> None:
        self.root = Path(f"{path}.renew")
        self.dir = self.root / boot

    def _file(self, lease_id: str) -> Path:
        return self.dir / hashlib.sha256(lease_id.encode()).hexdigest()[:32]

    def read(self, lease_id: str) -> int | None:
        """The time the lease was last renewed until here, or None (never renewed here)."""
        try:
            fd = os.open(self._file(lease_id), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BackendUnavailable(f"cannot read a renewal: {exc}", certain_no_effect=True) from exc
        try:
            for _ in range(_TORN_READS_MAX):
                data = os.pread(fd, _RECORD.size, 0)
                if len(data) < _RECORD.size:
                    return None  # created, not written yet: that renewal has not happened
                until, check = _RECORD.unpack(data)
                if until == 0 and check == 0:
                    return None  # only ended (`end` wrote its byte past a record never written): never renewed
                if check == _complement(until):
                    return int(until)
            raise BackendUnavailable("a renewal file keeps changing under its reader", certain_no_effect=True)
        finally:
            os.close(fd)

    def _open(self, lease_id: str) -> int:
        try:
            return os.open(self._file(lease_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            return os.open(self._file(lease_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self, lease_id: str, until_ns: int) -> bool:
        """Record that the lease is renewed until ``until_ns``; False if it was ended meanwhile.

        The end mark is read after the write: an end marked before that read
        refuses this renewal; one marked after it comes after the renewal (as a
        release committed after a renewal's transaction did). When the renewal
        counts is the caller's rule (see the module).
        """
        try:
            fd = self._open(lease_id)
            try:
                os.pwrite(fd, _RECORD.pack(until_ns, _complement(until_ns)), 0)
                return os.pread(fd, 1, _ENDED_AT) != _ENDED
            finally:
                os.close(fd)
        except OSError as exc:
            raise BackendUnavailable(f"cannot write a renewal: {exc}", certain_no_effect=True) from exc

    def end(self, lease_id: str) -> None:
        """Mark the lease ended (released or expired), so that its holder's next renewal is refused.

        The file stays: its holder removes it when it learns of the end (a
        holder renewing through a file that is gone would not). Called inside
        the transaction that ends the lease; if that transaction rolls back,
        the lease is still stored but can no longer be renewed (its holder
        loses it early: safe).
        """
        try:
            fd = self._open(lease_id)
            try:
                os.pwrite(fd, _ENDED, _ENDED_AT)
            finally:
                os.close(fd)
        except OSError as exc:
            raise BackendUnavailable(f"cannot end a renewal: {exc}", certain_no_effect=True) from exc

    def remove(self, lease_id: str) -> None:
        """Remove the file of a lease whose holder knows it ended (best effort: a lone opener sweeps the rest)."""
        try:
            os.unlink(self._file(lease_id))
        except OSError:
            pass

    def sweep(self, live: Iterable[str]) -> None:
        """Remove the files of other boots and of leases not in ``live`` (only when nobody else has the file open)."""
        keep = {self._file(lease_id).name for lease_id in live}
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return
        for entry in entries:
            if entry.name != self.dir.name:
                import shutil  # here: shutil loads bz2 and lzma, and a client of the host process never sweeps

                shutil.rmtree(entry.path, ignore_errors=True)
        try:
            files = list(os.scandir(self.dir))
        except OSError:
            return
        for entry in files:
            if entry.name not in keep:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass


class RenewingEngine(LeaseEngine):
    """A lease engine whose own leases are renewed through their renewal files (`RenewalFiles`).

    The leases granted by this engine object are remembered, as last renewed,
    until released or refused; every other lease is renewed by the engine's
    write unit, as before. ``_start_renewing(None)`` turns the files off.
    """

    _renewals: RenewalFiles | None = None

    def _start_renewing(self, renewals: RenewalFiles | None) -> None:
        self._renewals = renewals
        self._held: dict[str, Lease] = {}  # leases granted here, as last renewed here (see `renew`)
        self._filed: set[str] = set()  # those of them that have a renewal file
        self._held_lock = threading.Lock()

    def try_acquire_request(self, request: AcquireRequest) -> Outcome:
        # Here, not in `try_acquire`: every acquire goes through it (`try_acquire` checks, then calls it).
        outcome = super().try_acquire_request(request)
        if isinstance(outcome, Granted) and self._renewals is not None:
            with self._held_lock:
                if len(self._held) >= _HELD_PRUNE_AT:  # leases never released nor renewed to the end
                    now_ns = self.clock.now_ns()
                    for lease_id in [i for i, lease in self._held.items() if lease.expires_ns <= now_ns]:
                        del self._held[lease_id]
                        self._filed.discard(lease_id)
                self._held[outcome.lease.lease_id] = outcome.lease
        return outcome

    def renew(self, lease_id: str) -> Lease:
        """Extend a lease granted by this process by its TTL from now, writing only its renewal file.

        No write transaction, so no process frozen inside one can stop it. The
        renewal counts only if it was written before the deadline it extends
        had passed, by this clock read after the write; an expirer reads its
        clock before the file, so the two cannot both win
        (this module's docstring). A lease granted by another
        process is renewed by a write transaction, as before.

        Raises:
            NotHolder: the lease's deadline passed before this renewal was written
                (it may have been expired and the scope granted again).
        """
        with self._held_lock:
            lease = self._held.get(lease_id) if isinstance(lease_id, str) else None
        if lease is None or self._renewals is None:
            return super().renew(lease_id)
        now_ns = self.clock.now_ns()
        renewed = replace(lease, expires_ns=now_ns + lease.ttl_ms * 1_000_000)
        if now_ns < lease.expires_ns:
            with self._held_lock:
                # Before the file: this process's own units read the lease from here, and must
                # never see less than the file holds (a refused renewal only keeps it longer).
                self._held[lease_id] = renewed
                self._filed.add(lease_id)
            if (
                self._renewals.write(lease_id, renewed.expires_ns)  # False: released or expired meanwhile
                and self.clock.now_ns() < lease.expires_ns
            ):
                return renewed
        with self._held_lock:
            self._held.pop(lease_id, None)
        self._forget_file(lease_id)  # nobody renews it any more
        raise NotHolder(lease_hint(lease_id), "lease expired, was released, or never existed")

    def release(self, lease_id: str) -> Released:
        outcome = super().release(lease_id)  # a lease of this process: no end mark (see SQLiteRecords.renewing)
        with self._held_lock:
            if isinstance(lease_id, str):
                self._held.pop(lease_id, None)
        self._forget_file(lease_id)  # released by its holder: nobody renews it any more
        return outcome

    def _forget_file(self, lease_id: str) -> None:
        with self._held_lock:
            filed = isinstance(lease_id, str) and lease_id in self._filed
            self._filed.discard(lease_id)
        if filed and self._renewals is not None:
            self._renewals.remove(lease_id)
