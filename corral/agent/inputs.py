"""Bounds on what crosses the wire: what a tenant hands to a sandbox's processes (argv,
environment, working directory), and what a host reports about itself in its heartbeats.

One source for the public API's bodies and the agent's own: bad input is refused as a 422 naming the
field, long before ``execve`` would fail with E2BIG (its limit is a quarter of the stack limit, and a
single string may not pass 128 KiB), and never cut short at a NUL byte on the way to the kernel.
Sizes are counted in bytes as ``execve`` counts them: each string's UTF-8 bytes plus its NUL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated

from pydantic import AfterValidator, Field

from corral.images.digest import DIGEST_PATTERN

MAX_ARGS = 4096
MAX_ARGV_BYTES = 256 * 1024
MAX_ENV_ENTRIES = 256
MAX_ENV_BYTES = 256 * 1024
MAX_ENV_VALUE_BYTES = 128 * 1024 - 1  # the kernel's per-string limit, its NUL included
MAX_ENV_KEY_CHARS = 256
MAX_PATH_CHARS = 4096
# POSIX portable names: anything else (``A=B``, a NUL) cannot be one variable of an environment.
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _size(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass")) + 1


def check_argv(argv: Sequence[str]) -> Sequence[str]:
    if len(argv) > MAX_ARGS:
        raise ValueError(f"{len(argv)} arguments; at most {MAX_ARGS}")
    if not argv or not argv[0]:
        raise ValueError("the command needs a non-empty program name")
    for i, arg in enumerate(argv):
        if "\x00" in arg:
            raise ValueError(f"argument {i} contains a NUL byte")
    total = sum(_size(a) for a in argv)
    if total > MAX_ARGV_BYTES:
        raise ValueError(f"the arguments take {total} bytes; at most {MAX_ARGV_BYTES}")
    return argv


def check_env(env: Mapping[str, str]) -> Mapping[str, str]:
    total = 0
    for key, value in env.items():
        if len(key) > MAX_ENV_KEY_CHARS or not ENV_KEY.fullmatch(key):
            raise ValueError(
                f"{key[:64]!r} is not a variable name: letters, digits and '_', not starting with a digit"
            )
        if "\x00" in value:
            raise ValueError(f"the value of {key} contains a NUL byte")
        size = _size(value)
        if size > MAX_ENV_VALUE_BYTES + 1:
            raise ValueError(f"the value of {key} takes {size - 1} bytes; at most {MAX_ENV_VALUE_BYTES}")
        total += _size(key) + size
    if total > MAX_ENV_BYTES:
        raise ValueError(f"the environment takes {total} bytes; at most {MAX_ENV_BYTES}")
    return env


def check_path(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError("must be an absolute path")
    if "\x00" in path:
        raise ValueError("contains a NUL byte")
    return path


Argv = Annotated[list[str], Field(min_length=1, max_length=MAX_ARGS), AfterValidator(check_argv)]
Env = Annotated[dict[str, str], Field(max_length=MAX_ENV_ENTRIES), AfterValidator(check_env)]
AbsPath = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS), AfterValidator(check_path)]


# -- what a host reports ---------------------------------------------------------------------------
# Every number a heartbeat carries lands in a 64-bit column and in the placement arithmetic: bound it
# so a hostile or broken agent gets a 422, never a 500 or a poisoned record.

MAX_HOST_MEMORY_MB = 1 << 40
MAX_HOST_CPUS = 1_000_000.0
MAX_SEQ = (1 << 63) - 1
# At least 10,000 sandboxes per host, within one statement's parameter limits of both stores.
MAX_SANDBOXES_PER_HOST = 16_384
MAX_TEMPLATES_PER_HOST = 1024
# The images a heartbeat names (the host's most recently used, when its disk holds more): O(images),
# never O(sandboxes).
MAX_IMAGES_PER_HOST = 256
# An agent's base URL: http(s), a host (no credentials in it), an optional port and path; empty for
# an agent in the control plane's own process.
ADDRESS_PATTERN = r"^(https?://[A-Za-z0-9._~\-\[\]:%]+(/[A-Za-z0-9._~\-/%]*)?)?$"

Cpus = Annotated[float, Field(ge=0, le=MAX_HOST_CPUS, allow_inf_nan=False)]
MemoryMb = Annotated[int, Field(ge=0, le=MAX_HOST_MEMORY_MB)]
# Negative when the host holds more than it may admit.
AdmittableMb = Annotated[int, Field(ge=-MAX_HOST_MEMORY_MB, le=MAX_HOST_MEMORY_MB)]
Count = Annotated[int, Field(ge=0, le=1_000_000)]
Seq = Annotated[int, Field(ge=1, le=MAX_SEQ)]
Timestamp = Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False)]
Address = Annotated[str, Field(max_length=2048, pattern=ADDRESS_PATTERN)]
Word = Annotated[str, Field(min_length=1, max_length=128)]
Digest = Annotated[str, Field(pattern=DIGEST_PATTERN)]
