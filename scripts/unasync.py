"""Write the blocking client from the asyncio one, so the two cannot drift apart.

``corral/client/async_client.py`` is the source; ``corral/client/client.py`` is its output: the same
code with the coroutines made plain calls (``async def`` -> ``def``, ``await x`` -> ``x``) and each
async name swapped for its blocking twin. The result goes through ``ruff format`` so that it passes the
same lint and format checks as the rest of the package.

    python scripts/unasync.py          # rewrite client.py
    python scripts/unasync.py --check  # exit 1 if client.py is not what the source generates
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "corral" / "client" / "async_client.py"
TARGET = ROOT / "corral" / "client" / "client.py"

DOCSTRING = '''"""``Corral``: the blocking client, its sandbox handle and its admin verbs.

Generated from ``async_client.py`` by ``scripts/unasync.py``: edit that file, then run ``make unasync``."""'''

# Applied in order, each to the whole text. Names are matched as whole words, so ``AsyncSandbox`` does
# not touch ``AsyncSandboxes``.
SUBSTITUTIONS: list[tuple[str, str]] = [
    (r"^import asyncio\n", ""),
    (r"\bAwaitable, ", ""),
    (r"Awaitable\[None\]", "None"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\(await ([\w.]+\([^()]*\))\)", r"\1"),
    (r"\bawait ", ""),
    (r"\basync (def|with|for)\b", r"\1"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\baread\b", "read"),
    (r"\baiter_lines\b", "iter_lines"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncBaseTransport\b", "BaseTransport"),
    (r"\bAsyncClient\b", "Client"),
    (
        r"\bAsync(Corral|Sandboxes|Sandbox|Hosts|Tokens|Tenants|Pools|Templates|Commands|CommandHandle)\b",
        r"\1",
    ),
    (r"\bAn asyncio connection\b", "A connection"),
    (r"\bthe asyncio client\b", "the blocking client"),
    # An async generator cannot delegate with ``yield from``; a plain one can.
    (r"for (\w+) in ([\w.]+(?:\(\))?):\n\s+yield \1\n", r"yield from \2\n"),
]


def generate(source: str) -> str:
    end = source.index('"""', 3) + 3
    text = DOCSTRING + source[end:]
    for pattern, replacement in SUBSTITUTIONS:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    # Renamed imports fall out of order: sort them, then format, as the lint would ask.
    text = _ruff(["check", "--select", "I", "--fix", "--quiet", "--exit-zero"], text)
    return _ruff(["format"], text)


def _ruff(args: list[str], text: str) -> str:
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run(
        [str(ruff) if ruff.exists() else "ruff", *args, "--stdin-filename", str(TARGET), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout


def main(argv: list[str]) -> int:
    wanted = generate(SOURCE.read_text())
    if "--check" in argv:
        if TARGET.read_text() != wanted:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run `make unasync`", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
