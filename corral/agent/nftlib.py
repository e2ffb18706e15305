"""nftables transactions from inside the agent's process, through libnftables (the library the ``nft``
command is made of, in the same Debian package). A transaction costs its netlink round trips; ``nft
-f`` costs a process start on top (15-25 ms measured here, against 0.2-3 ms in process), which made a
pooled slot's take cost 18 ms where the bar is 1 ms. Blocking: callers run it off the event loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

_LIBRARY = "libnftables.so.1"


class NftError(Exception):
    """A transaction nftables refused (nothing of it applied); the message is nftables' own."""


class _Nft:
    """One libnftables context; a context is not safe to share between threads, hence the lock."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("nftables") or _LIBRARY, use_errno=True)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        self._lib = lib
        self._ctx = lib.nft_ctx_new(0)  # NFT_CTX_DEFAULT
        if not self._ctx:
            raise OSError("libnftables could not make a context")
        # Output and errors into buffers read after each command, never onto the agent's stdout.
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)
        self._lock = threading.Lock()

    def run(self, text: str, *, wait: bool = True) -> str | None:
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            rc = self._lib.nft_run_cmd_from_buffer(self._ctx, text.encode())
            out = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode(errors="replace")
            err = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode(errors="replace")
        finally:
            self._lock.release()
        if rc != 0:
            raise NftError(err.strip() or f"nftables refused the transaction ({rc})")
        return out


_nft: _Nft | None = None
_making = threading.Lock()


def available() -> bool:
    return ctypes.util.find_library("nftables") is not None


def run(text: str) -> str:
    """Run ``text`` (``nft -f`` syntax) as one transaction: all of it or, on :class:`NftError`, none."""
    out = _context().run(text)
    assert out is not None  # waited for the context
    return out


def run_if_free(text: str) -> str | None:
    """:func:`run`, or None at once (nothing run) while another thread's transaction holds the
    context: for a caller on an event loop, which must not wait on a thread."""
    return _context().run(text, wait=False)


def _context() -> _Nft:
    global _nft
    if _nft is None:
        with _making:
            if _nft is None:
                _nft = _Nft()
    return _nft
