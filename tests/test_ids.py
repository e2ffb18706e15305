from __future__ import annotations

import os

from corral.ids import new_sandbox_id, random_hex, time_ordered_hex


def test_ids_have_the_asked_width_and_do_not_repeat() -> None:
    ids = {random_hex(80) for _ in range(10_000)}
    assert len(ids) == 10_000 and all(len(i) == 20 for i in ids)


def test_ids_differ_across_forked_workers() -> None:
    # A pre-forking server forks after import: each worker must still draw its own ids.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id and leave at once
        os.write(write, random_hex(128).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 32 and child != random_hex(128)


def test_time_ordered_ids_sort_by_their_time_and_still_do_not_repeat() -> None:
    now = 1_764_547_200.0
    same_ms = {time_ordered_hex(now, 52) for _ in range(10_000)}
    assert len(same_ms) == 10_000
    later = [time_ordered_hex(now + i * 0.001, 52) for i in range(1_000)]
    assert later == sorted(later)
    assert all(len(i) == 24 for i in later)
    # a sandbox id carries its creation time the same way
    assert new_sandbox_id(now) < new_sandbox_id(now + 0.002) and new_sandbox_id(now).startswith("sb-")
    assert time_ordered_hex(0.0, 8).startswith("0" * 11)
