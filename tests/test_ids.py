from __future__ import annotations

import os

from corral.ids import random_hex


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
