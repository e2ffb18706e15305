"""The code blocks of README.md and docs/*.md that are meant to be run, found so a test can run them.

A ```` ```python ```` block is run unless the line before it says ``<!-- doc-test: skip: WHY -->``; a
```` ```sh ```` block only when the line before it says ``<!-- doc-test: run -->`` (most shell blocks
start servers, or name machines of your own). Other blocks (output, diagrams, configuration) are
text."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!-- doc-test: (run|skip)(?::\s*(.*?))? -->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of its opening fence, 1-based
    lang: str
    code: str
    run: bool
    why: str | None = None  # why it is not run, when it is marked so

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        start, lang = i, opening.group(1)
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        mark = _MARK.match(lines[start - 1].strip()) if start > 0 else None
        marked = mark.group(1) if mark else None
        run = (lang == "python" and marked != "skip") or (lang == "sh" and marked == "run")
        why = mark.group(2) if mark and marked == "skip" else None
        found.append(Block(path, start + 1, lang, "\n".join(body) + "\n", run, why))
    return found


def runnable() -> list[Block]:
    return [b for path in DOCS for b in blocks(path) if b.run]
