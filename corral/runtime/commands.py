"""An image sandbox's command server: the guest channel (see :mod:`corral.runtime.guest`) served by
the launcher's ``serve-root`` mode rather than by the sandbox's init.

The init of an image's sandbox cannot run its commands: bubblewrap gave it ``no_new_privs``, which
every child inherits and none can clear, so the image's setuid ``sudo`` would never work in them. The
server is started from the host the way ``launcher exec-root`` enters the sandbox (the same namespace
and cgroup entry, the same check of the init's identity, no ``no_new_privs``) and forked into the
sandbox's pid namespace and cgroups, so its commands are counted and killed with the sandbox and it
ends with the sandbox's pid namespace; the launcher stays, outside, as its reaper (the init's exit
waits for every process of its namespace to be reaped: never for the host's pid 1). Its credentials are the host's (root, not dumpable): no process
inside, its root included, may signal, ptrace or read it. Each command's child finishes what
``exec-root`` does: the sandbox's user namespace, a container root's bounding set, the seccomp filter,
the user the runtime names, the working directory, the environment, execve.

Its listening socket is bound by the runtime under a name of its own in the sandbox's state directory
(0600, root's, no path to it inside), handed to the server, and renamed over ``channel`` once the
server serves it: a connection made at that name always reaches a server that is serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from corral.runtime import child, guest, launcher, procfs

# Its name in the process table (/proc/PID/comm), as the launcher sets it.
SERVER_NAME = "corral-commands"
_READY = b"ready\n"
_START_TIMEOUT_S = 5.0
_names = itertools.count()


async def start(directory: Path, init: procfs.ProcessIdentity, procs: Sequence[Path]) -> str | None:
    """Start a command server for the sandbox of ``init`` (its cgroups' ``procs`` files), serving the
    guest channel at ``directory/channel`` from now on: None once it serves, else why it does not."""
    name = f"{guest.SOCKET_NAME}.{os.getpid()}.{next(_names)}"
    try:
        listener = guest.listen(directory, name)
    except OSError as exc:  # its state directory gone: the sandbox stopped meanwhile
        return f"cannot listen in {directory}: {exc}"
    try:
        argv = [str(launcher.path()), "serve-root", str(init.pid), str(init.pid_ns), str(listener.fileno())]
        server = await child.start(
            [*argv, *map(str, procs)], env=launcher.clean_env(), pass_fds=(listener.fileno(),), stdin=False
        )
    except OSError as exc:
        _unlink(directory, name)
        return f"cannot start the command server: {exc}"
    except BaseException:
        _unlink(directory, name)
        raise
    finally:
        listener.close()  # the server holds it now, or nobody does
    try:
        # Both end once the server has said it is ready (it then holds /dev/null, as its reaper does)
        # or has failed.
        said, why = await asyncio.wait_for(
            asyncio.gather(server.stdout.read(), server.stderr.read()), _START_TIMEOUT_S
        )
    except TimeoutError:
        server.signal(signal.SIGKILL)
        _unlink(directory, name)
        return "the command server did not start in time"
    except BaseException:
        _unlink(directory, name)
        raise
    if said != _READY:
        _unlink(directory, name)
        return why.decode(errors="replace").strip() or "the command server failed"
    try:
        with guest.short_path(directory) as where:
            os.rename(f"{where}/{name}", f"{where}/{guest.SOCKET_NAME}")
    except OSError as exc:
        return f"cannot put the command server's socket in place: {exc}"
    return None


def _unlink(directory: Path, name: str) -> None:
    with contextlib.suppress(OSError), guest.short_path(directory) as where:
        os.unlink(f"{where}/{name}")
