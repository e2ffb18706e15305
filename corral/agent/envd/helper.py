"""The program every file operation of the data plane runs *inside* the sandbox, as the sandbox user.

It runs through the launcher like any tenant command, so a path resolves in the sandbox's own mount
namespace with the sandbox user's rights: ``..``, a symlink pointing out, or an absolute path name the
sandbox's files, never the host's. Standard library only (it runs under the sandbox's python3).

argv[1] is the request as JSON. Answers: the JSON result on stdout (exit 0); for ``read``, a NUL byte
then the file's bytes; for ``write``, the bytes to write arrive on stdin. Failures: exit 3 and
``{"code", "message"}`` on stderr, ``code`` a Connect code name.
"""

import contextlib
import datetime
import errno
import grp
import json
import os
import pwd
import shutil
import signal
import stat
import sys
from typing import Any, NoReturn

CHUNK = 64 * 1024
CODES = {
    errno.ENOENT: "not_found",
    errno.EEXIST: "already_exists",
    errno.ENOTEMPTY: "already_exists",
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.EROFS: "permission_denied",
    errno.ENOSPC: "resource_exhausted",
    errno.EDQUOT: "resource_exhausted",
}


def fail(code: str, message: str) -> NoReturn:
    sys.stderr.write(json.dumps({"code": code, "message": message}))
    sys.exit(3)


def absolute(path: Any) -> str:
    if not isinstance(path, str) or not path or "\0" in path:
        fail("invalid_argument", "path must be a non-empty string")
    path = os.path.expanduser(path) if path.startswith("~") else path
    return os.path.normpath(os.path.join(os.path.expanduser("~"), path))


def name_of(table: Any, ident: int) -> str:
    try:
        return str(table(ident)[0])
    except KeyError:
        return str(ident)


def entry(path: str) -> dict[str, Any]:
    """E2B's entry: a symlink is reported as what it leads to (its type and mode), with the fully
    resolved path as its target and ``isSymlink``; one that leads nowhere has no type."""
    info = os.lstat(path)
    mode_of: os.stat_result | None = info
    target = None
    if stat.S_ISLNK(info.st_mode):
        target = os.path.realpath(path)
        try:
            mode_of = os.stat(path)
        except OSError:
            mode_of, target = None, path
    if mode_of is None:
        kind, mode = "FILE_TYPE_UNSPECIFIED", 0
    else:
        kind = "FILE_TYPE_DIRECTORY" if stat.S_ISDIR(mode_of.st_mode) else "FILE_TYPE_FILE"
        mode = stat.S_IMODE(mode_of.st_mode)
    permissions = stat.filemode(info.st_mode)
    if target is not None:
        permissions = "L" + permissions[1:]  # as Go writes a symlink's mode
    modified = datetime.datetime.fromtimestamp(info.st_mtime, datetime.UTC)
    out: dict[str, Any] = {
        "name": os.path.basename(path) or "/",
        "type": kind,
        "path": path,
        "size": str(info.st_size),
        "mode": mode,
        "permissions": permissions,
        "owner": name_of(pwd.getpwuid, info.st_uid),
        "group": name_of(grp.getgrgid, info.st_gid),
        "modifiedTime": modified.isoformat().replace("+00:00", "Z"),
    }
    if target is not None:
        out["symlinkTarget"] = target
        out["isSymlink"] = True
    return out


def listing(path: str, depth: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for name in sorted(os.listdir(path)):
        child = os.path.join(path, name)
        found.append(entry(child))
        if depth > 1 and os.path.isdir(child) and not os.path.islink(child):
            found += listing(child, depth - 1)
    return found


# inotify's masks (linux/inotify.h), and the E2B event each becomes (as Go's fsnotify names them).
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_ISDIR = 0x4000, 0x8000, 0x1000000, 0x40000000
WATCHED = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
EVENT_TYPES = (
    (IN_CREATE | IN_MOVED_TO, "EVENT_TYPE_CREATE"),
    (IN_MODIFY, "EVENT_TYPE_WRITE"),
    (IN_DELETE | IN_DELETE_SELF, "EVENT_TYPE_REMOVE"),
    (IN_MOVED_FROM | IN_MOVE_SELF, "EVENT_TYPE_RENAME"),
    (IN_ATTRIB, "EVENT_TYPE_CHMOD"),
)
MAX_WATCHES = 4096  # directories one recursive watch follows; past it, deeper ones go unwatched


def watch(path: str, recursive: bool) -> None:
    """Follow the directory ``path`` (and, ``recursive``, every directory under it) with inotify,
    writing each event as a JSON line on stdout, after a first line saying the watch is in place.
    Runs until killed. A reader that falls behind blocks these writes; the kernel's own bounded
    queue then drops events (inotify's overflow), so nothing here grows with a flood."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1 failed")
    names: dict[int, str] = {}  # watch descriptor -> its directory, relative to ``path``

    def add(first: str) -> None:
        pending = [first]  # a stack, not recursion: a deep tree is no deeper a call stack
        while pending and len(names) < MAX_WATCHES:
            relative = pending.pop()
            target = os.path.join(path, relative) if relative else path
            wd = libc.inotify_add_watch(fd, os.fsencode(target), WATCHED | IN_ONLYDIR)
            if wd < 0:
                err = ctypes.get_errno()
                if not relative:
                    raise OSError(err, os.strerror(err), path)
                continue  # a subdirectory gone or unreadable meanwhile: not the watch's failure
            names[wd] = relative
            if recursive:
                with contextlib.suppress(OSError):
                    for item in os.scandir(target):
                        if item.is_dir(follow_symlinks=False):
                            pending.append(os.path.join(relative, item.name))

    if not os.path.isdir(path):
        if os.path.exists(path):
            fail("invalid_argument", f"path {path} is not a directory")
        raise FileNotFoundError(errno.ENOENT, "no such directory", path)
    add("")
    out = sys.stdout
    out.write(json.dumps({"start": path}) + "\n")
    out.flush()
    header = struct.Struct("iIII")
    while True:
        data = os.read(fd, 64 * 1024)
        offset = 0
        while offset + header.size <= len(data):
            wd, mask, _cookie, length = header.unpack_from(data, offset)
            raw = data[offset + header.size : offset + header.size + length].rstrip(b"\0")
            offset += header.size + length
            if mask & (IN_Q_OVERFLOW | IN_IGNORED) or wd not in names:
                continue
            name = os.path.join(names[wd], os.fsdecode(raw)) if raw else names[wd]
            if recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                add(name)
            for bits, kind in EVENT_TYPES:
                if mask & bits:
                    out.write(json.dumps({"name": name, "type": kind}) + "\n")
        out.flush()


def run(req: dict[str, Any]) -> Any:
    op = req.get("op")
    if op == "watch":
        watch(absolute(req.get("path")), bool(req.get("recursive")))
    if op == "stat":
        return {"entry": entry(absolute(req.get("path")))}
    if op == "list":
        path = absolute(req.get("path"))
        if not os.path.isdir(path):
            if os.path.exists(path):
                fail("invalid_argument", f"{path} is not a directory")
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        return {"entries": listing(path, max(1, int(req.get("depth") or 1)))}
    if op == "mkdir":
        path = absolute(req.get("path"))
        os.makedirs(path)
        return {"entry": entry(path)}
    if op == "move":
        source, destination = absolute(req.get("source")), absolute(req.get("destination"))
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        try:
            os.rename(source, destination)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.move(source, destination)  # another filesystem (home and /tmp are apart): copy
        return {"entry": entry(destination)}
    if op == "remove":  # as E2B's (Go's RemoveAll): a path that does not exist is already removed
        path = absolute(req.get("path"))
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return {}
    if op == "read":
        path = absolute(req.get("path"))
        with open(path, "rb") as stream:
            if stat.S_ISDIR(os.fstat(stream.fileno()).st_mode):
                fail("invalid_argument", f"{path} is a directory")
            sys.stdout.buffer.write(b"\0")
            while chunk := stream.read(CHUNK):
                sys.stdout.buffer.write(chunk)
        return None
    if op == "write":
        path = absolute(req.get("path"))
        if os.path.isdir(path):
            fail("invalid_argument", f"{path} is a directory")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Written beside the target and renamed over it once complete: an upload cut short (too big,
        # stalled, the caller gone: the agent sends SIGTERM) never leaves half a file behind.
        partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.partial")

        def abandon(_signum: int, _frame: Any) -> None:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            os._exit(4)

        signal.signal(signal.SIGTERM, abandon)
        try:
            with open(partial, "wb") as f:
                while chunk := sys.stdin.buffer.read(CHUNK):
                    f.write(chunk)
            os.replace(partial, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
        return [{"name": os.path.basename(path), "type": "file", "path": path}]
    fail("invalid_argument", f"unknown operation {op!r}")
    return None


def main() -> None:
    try:
        req = json.loads(sys.argv[1])
        if not isinstance(req, dict):
            raise ValueError("not an object")
    except (IndexError, ValueError) as exc:
        fail("invalid_argument", f"bad request: {exc}")
    try:
        result = run(req)
    except OSError as exc:
        fail(
            CODES.get(exc.errno or 0, "invalid_argument"),
            f"{exc.strerror}: {exc.filename or ''}".rstrip(": "),
        )
    if result is not None:
        sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
