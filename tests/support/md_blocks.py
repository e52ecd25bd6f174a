"""The fenced code blocks of a Markdown page, as the README's and the docs' tests read them."""

from __future__ import annotations


def shell_blocks(text: str) -> list[str]:
    """The contents of every fenced block of ``text``, in order (whatever their language)."""
    blocks: list[str] = []
    current: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append("\n".join(current))
            inside, current = not inside, []
        elif inside:
            current.append(line)
    return blocks
