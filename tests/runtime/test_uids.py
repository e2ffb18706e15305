"""Host uids for sandboxes: one lease per uid, machine-wide, reclaimed when its sandbox's record is gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.runtime.uids import UidAllocator, UidsExhausted, parse_range


def _records(root: Path, *ids: str) -> Path:
    for sandbox_id in ids:
        (root / sandbox_id).mkdir(parents=True)
    return root


def test_leases_are_exclusive_and_name_their_owner(tmp_path: Path) -> None:
    root = _records(tmp_path / "records", "a", "b")
    alloc = UidAllocator(tmp_path / "uids", range(100, 103), root)
    first, second = alloc.acquire("a"), alloc.acquire("b")
    assert first != second and {first, second} <= {100, 101, 102}
    lease = alloc.holder(first)
    assert lease is not None and (lease.root, lease.sandbox_id) == (str(root.resolve()), "a")
    assert (tmp_path / "uids" / str(first)).stat().st_mode & 0o777 == 0o600


def test_two_allocators_in_one_directory_never_share_a_uid(tmp_path: Path) -> None:
    one = UidAllocator(tmp_path / "uids", range(100, 104), _records(tmp_path / "one", "s1", "s2"))
    two = UidAllocator(tmp_path / "uids", range(100, 104), _records(tmp_path / "two", "s1", "s2"))
    got = [one.acquire("s1"), two.acquire("s1"), one.acquire("s2"), two.acquire("s2")]
    assert sorted(got) == [100, 101, 102, 103]
    with pytest.raises(UidsExhausted):
        one.acquire("s1")


def test_release_frees_only_its_own_lease(tmp_path: Path) -> None:
    root = _records(tmp_path / "records", "a")
    alloc = UidAllocator(tmp_path / "uids", range(100, 101), root)
    uid = alloc.acquire("a")
    alloc.release(uid, "someone-else")
    assert alloc.holder(uid) is not None
    alloc.release(uid, "a")
    assert alloc.holder(uid) is None
    assert alloc.acquire("a") == uid


def test_a_lease_whose_record_is_gone_is_reclaimed(tmp_path: Path) -> None:
    root = _records(tmp_path / "records", "crashed", "live", "new")
    alloc = UidAllocator(tmp_path / "uids", range(100, 102), root)
    stale, live = alloc.acquire("crashed"), alloc.acquire("live")
    (root / "crashed").rmdir()  # its owner tore it down and crashed before releasing
    other = UidAllocator(tmp_path / "uids", range(100, 102), _records(tmp_path / "other", "x"))
    assert other.acquire("x") == stale
    lease = other.holder(stale)
    assert lease is not None and lease.sandbox_id == "x"
    assert alloc.holder(live) is not None  # a lease with a live record is never taken
    with pytest.raises(UidsExhausted):
        alloc.acquire("new")


_RACE = """
import sys
from pathlib import Path
from corral.runtime.uids import UidAllocator
root = Path(sys.argv[2])
alloc = UidAllocator(Path(sys.argv[1]), range(500, 540), root)
got = []
for i in range(10):
    (root / f"s{i}").mkdir(parents=True, exist_ok=True)
    got.append(alloc.acquire(f"s{i}"))
print(" ".join(map(str, got)))
"""


def test_processes_racing_for_uids_get_distinct_ones(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, str(tmp_path / "uids"), str(tmp_path / f"r{n}")],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    uids = [int(u) for p in procs for u in p.communicate(timeout=60)[0].split()]
    assert len(uids) == 40 and len(set(uids)) == 40


@pytest.mark.parametrize("bad", ["", "5", "10-5", "0-100", "a-b", "2000000-4294967295"])
def test_bad_ranges_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_range(bad)


def test_a_range_is_inclusive() -> None:
    assert parse_range("2000000-2000009") == range(2_000_000, 2_000_010)
