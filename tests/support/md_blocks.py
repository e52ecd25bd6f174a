"""The fenced code blocks of a Markdown page, as the README's and the docs' tests read them: each
with its info string (its language and options such as ``no-run=REASON`` or ``file=NAME``), its
text and where it starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness import ROOT


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its info string, its text, where it starts."""

    page: Path
    line: int
    info: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def language(self) -> str:
        return self.info.split(" ", 1)[0]

    def option(self, name: str) -> str | None:
        """The value of ``name=VALUE`` in the info string (``""`` for a bare word)."""
        for word in self.info.split()[1:]:
            key, _, value = word.partition("=")
            if key == name:
                return value
        return None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order."""
    found: list[Block] = []
    info, start = "", 0
    lines: list[str] = []
    inside = False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if line.startswith("```"):
            if inside:
                found.append(Block(page, start, info, "\n".join(lines) + "\n"))
                inside = False
            else:
                info, start, lines, inside = line[3:].strip(), number, [], True
        elif inside:
            lines.append(line)
    assert not inside, f"{page.name}:{start}: a block is never closed"
    return found


def shell_blocks(page: Path) -> list[Block]:
    """The ``sh`` blocks of ``page``, in order."""
    return [block for block in blocks(page) if block.language == "sh"]
