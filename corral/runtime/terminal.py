"""A terminal for a command in a process sandbox: a pty pair of the sandbox's own devpts (bubblewrap's
``--dev`` mounts a private instance at /dev/pts), so inside it is an ordinary ``/dev/pts/N`` that
``tty`` names, and nothing of the host's devpts is shown to the tenant.

The runtime (host root) opens the sandbox's ``ptmx`` through its init's root, resolved by ``openat2``
inside that root with no symlink followed, and checks it is devpts's own ``ptmx`` before using it:
the tenant can rename or replace nothing on the way (``/dev/pts`` is a mount point, devpts makes no
nodes on request, and ``mount`` is not among its system calls), and this makes sure of it. The slave
is taken from the master (``TIOCGPTPEER``), never by a path the tenant could race.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import stat
import struct
import termios
from collections.abc import Iterable

from corral.runtime.stream import PtySize

MAX_SIDE = 0xFFFF  # a winsize field is an unsigned short
_SYS_OPENAT2 = 437  # the same number on every architecture Linux added it to (5.6)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_IN_ROOT = 0x10
# ioctl numbers of the generic table (x86-64, arm64), which termios does not all name.
_TIOCSPTLCK = 0x40045431  # unlock the slave before taking it
_TIOCGSID = 0x5429
_TIOCGPTPEER = 0x5441
_PTMX = os.makedev(5, 2)
_DEVPTS_MAGIC = 0x1CD1
_WINSIZE = struct.Struct("HHHH")
_libc = ctypes.CDLL(None, use_errno=True)


class TerminalError(OSError):
    """The sandbox's devpts cannot give a terminal (it is not there, or not what it must be)."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_long * 15)]


def check_size(size: PtySize) -> None:
    for side in (size.rows, size.cols):
        if not isinstance(side, int) or isinstance(side, bool) or not 0 < side <= MAX_SIDE:
            raise ValueError(f"a terminal's rows and cols are whole numbers from 1 to {MAX_SIDE}")


def open_in_root(root: int, path: str, flags: int) -> int:
    """``path`` opened under the directory ``root`` as if it were ``/``, following no symlink."""
    how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(_SYS_OPENAT2, root, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def open_pair(init_pid: int, pid_ns: int, size: PtySize) -> tuple[int, int]:
    """A master and its slave in the devpts of the sandbox whose init is ``init_pid`` (its pid
    namespace still inode ``pid_ns``: a recycled pid is refused), sized ``size``."""
    check_size(size)
    proc = os.open(f"/proc/{init_pid}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # Checked through the directory held open: it names this process for as long as it lives.
        if os.stat("ns/pid", dir_fd=proc).st_ino != pid_ns:
            raise TerminalError(errno.ESRCH, "the sandbox's init is gone")
        root = os.open("root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    finally:
        os.close(proc)
    try:
        master, slave = open_under(root)
    finally:
        os.close(root)
    try:
        resize(master, size)
    except BaseException:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


def open_under(root: int) -> tuple[int, int]:
    """A master and its slave from the devpts at ``dev/pts`` under the directory ``root``."""
    master = open_in_root(root, "dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY)
    try:
        info = os.fstat(master)
        fs = _StatFs()
        if _libc.fstatfs(master, ctypes.byref(fs)) != 0:
            raise TerminalError(ctypes.get_errno(), "fstatfs of the sandbox's ptmx failed")
        if not stat.S_ISCHR(info.st_mode) or info.st_rdev != _PTMX or fs.f_type != _DEVPTS_MAGIC:
            raise TerminalError(errno.ENOTTY, "the sandbox's /dev/pts/ptmx is not devpts's ptmx")
        fcntl.ioctl(master, _TIOCSPTLCK, struct.pack("i", 0))
        slave = int(fcntl.ioctl(master, _TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC))
    except BaseException:
        os.close(master)
        raise
    return master, slave


def resize(master: int, size: PtySize) -> None:
    """The terminal's new size; the kernel sends its foreground process group SIGWINCH."""
    check_size(size)
    fcntl.ioctl(master, termios.TIOCSWINSZ, _WINSIZE.pack(size.rows, size.cols, 0, 0))


def session_of(master: int) -> int | None:
    """The host pid of the session leader on the terminal (the command), None once it has none."""
    try:
        (sid,) = struct.unpack("i", fcntl.ioctl(master, _TIOCGSID, struct.pack("i", 0)))
    except OSError:
        return None
    return sid if sid > 0 else None


def signal_session(session: int, pids: Iterable[int], sig: int) -> None:
    """``sig`` to each of ``pids`` that is in ``session``: held by a pidfd while its session is
    checked, so a pid reused meanwhile is never the one signalled."""
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        try:
            if os.getsid(pid) == session:
                signal.pidfd_send_signal(pidfd, sig)
        except OSError:
            pass  # gone meanwhile
        finally:
            os.close(pidfd)
