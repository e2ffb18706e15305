"""Host uids for sandboxes: each sandbox runs as its own host uid (and gid of the same number), unique
across the whole machine however many runtimes share it (``corral serve`` runs many agents in one
process; several ``corral agent`` processes may run side by side). An image's sandbox leases a range
instead (:data:`DEFAULT_UID_RANGES`: an allocator over a stepped range hands out each range's first uid).

A uid is held by a lease file, ``<directory>/<uid>``, created with O_EXCL and naming the state directory root
and sandbox id that own it. A lease whose sandbox record no longer exists is stale (its owner crashed
between tearing the sandbox down and releasing it) and is reclaimed by the next allocator that meets
it. Allocation and reclaim hold an exclusive ``flock`` on the directory's lock file, so two allocators
never reclaim the same lease and hand it out twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

DEFAULT_LEASE_DIR = Path("/run/corral/uids")
# Far above any account a distribution creates and below the 2^31 a user namespace can map.
DEFAULT_UIDS = range(2_000_000, 2_065_536)
# An image's sandbox maps a whole range of host uids (its uid 0 is the range's first): ranges of
# RANGE_SPAN, leased by their first uid in the same directory, from 0x70000000 (above systemd's
# container ranges) to the 2^31 a user namespace can map; 4095 sandboxes at once.
RANGE_SPAN = 65536
DEFAULT_UID_RANGES = range(0x7000_0000, 2**31 - RANGE_SPAN, RANGE_SPAN)
_LOCK = ".lock"
T = TypeVar("T")


class UidsExhausted(Exception):
    """Every uid of the range is leased to a live sandbox."""


@dataclass(frozen=True, slots=True)
class Lease:
    uid: int
    root: str  # the state directory root of the runtime that holds it
    sandbox_id: str

    def owner_exists(self) -> bool:
        return (Path(self.root) / self.sandbox_id).is_dir()


def parse_range(text: str) -> range:
    """``START-END`` (inclusive) -> a range of uids; ValueError when malformed or unsafe."""
    start_text, sep, end_text = text.partition("-")
    if not sep or not start_text.isdigit() or not end_text.isdigit():
        raise ValueError(f"expected START-END, got {text!r}")
    start, end = int(start_text), int(end_text)
    if not 1000 <= start <= end < 2**31 - 1:
        raise ValueError(f"uid range {text!r} must be within 1000..2147483646 and not empty")
    return range(start, end + 1)


def overlaps(uids: range, ranges: range) -> bool:
    """Whether single uids of ``uids`` fall in any range leased from ``ranges`` (step = span)."""
    if not uids or not ranges:
        return False
    return uids.start < ranges[-1] + ranges.step and ranges.start < uids.stop


class UidAllocator:
    """Leases uids from ``uids`` in ``directory`` for the sandboxes recorded under ``statedir_root``
    (with a step: the first uids of ranges of that many)."""

    def __init__(self, directory: Path, uids: range, statedir_root: Path) -> None:
        if not uids:
            raise ValueError("the uid range is empty")
        if uids.step < 1 or uids[-1] + uids.step > 2**31 - 1:
            raise ValueError("uid ranges must ascend and stay below 2^31 - 1")
        self.directory = directory
        self.uids = uids
        self.statedir_root = str(statedir_root.resolve())
        # Where the next search starts: spreads allocators over the range instead of having all of
        # them probe the same first leases.
        self._cursor = abs(hash(self.statedir_root)) % len(uids)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.directory / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def acquire(self, sandbox_id: str) -> int:
        """A uid no other sandbox on this machine holds, leased to ``sandbox_id``, whose record must
        already exist under the state directory root (or the lease would look stale at once)."""
        body = json.dumps({"root": self.statedir_root, "sandbox_id": sandbox_id}).encode()
        with self._locked():
            for step in range(len(self.uids)):
                index = (self._cursor + step) % len(self.uids)
                uid = self.uids[index]
                if self._try_create(uid, body) or (
                    self._reclaim_if_stale(uid) and self._try_create(uid, body)
                ):
                    self._cursor = (index + 1) % len(self.uids)
                    return uid
        raise UidsExhausted(f"all {len(self.uids)} sandbox uids are in use")

    def _try_create(self, uid: int, body: bytes) -> bool:
        try:
            fd = os.open(
                self.directory / str(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
            )
        except FileExistsError:
            return False
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        return True

    def _reclaim_if_stale(self, uid: int) -> bool:
        lease = self.holder(uid)
        if lease is not None and lease.owner_exists():
            return False
        with contextlib.suppress(FileNotFoundError):
            (self.directory / str(uid)).unlink()
        return True

    def reclaim(self, keep: Callable[[Lease], bool], undo: Callable[[int], None]) -> list[int]:
        """Take back every lease of the range that ``keep`` refuses, and any torn one: ``undo`` removes
        what the holder left under that uid, then the lease goes. Under the lock, so no allocator hands
        one out meanwhile. Returns the uids taken back."""
        taken: list[int] = []
        with self._locked():
            for entry in os.scandir(self.directory):
                if not entry.name.isdigit() or int(entry.name) not in self.uids:
                    continue
                uid = int(entry.name)
                lease = self.holder(uid)
                if lease is not None and keep(lease):
                    continue
                undo(uid)
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / entry.name).unlink()
                taken.append(uid)
        return taken

    def under_lock(self, work: Callable[[], T]) -> T:
        """``work`` done while no allocator of this directory hands out or takes back a lease."""
        with self._locked():
            return work()

    def holder(self, uid: int) -> Lease | None:
        """Who holds ``uid``; None when nobody does or the lease cannot be read (a torn write)."""
        try:
            data = json.loads((self.directory / str(uid)).read_text())
            return Lease(uid, str(data["root"]), str(data["sandbox_id"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def release(self, uid: int, sandbox_id: str) -> None:
        """Give ``uid`` back, if it is still leased to this sandbox of ours."""
        with self._locked():
            if self.holder(uid) == Lease(uid, self.statedir_root, sandbox_id):
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / str(uid)).unlink()
