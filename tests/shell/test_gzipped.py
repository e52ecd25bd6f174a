"""gzip files as a killed writer leaves them: members read one after another, a cut told apart
from a complete stream, bounded pieces."""

from __future__ import annotations

import gzip
import io
import random
from pathlib import Path

import pytest

from proxy.shell.gzipped import Inflater, incomplete

DATA = random.Random(3).randbytes(200_000).hex().encode()


def test_members_one_after_another_padding_aside() -> None:
    """Two members (two runs appending), zero bytes after each: the bytes of both, in order,
    never more than a piece at a time."""
    inflater = Inflater(io.BytesIO(gzip.compress(b"one\n") + b"\0" * 10 + gzip.compress(DATA)))
    pieces = list(inflater)
    assert b"".join(pieces) == b"one\n" + DATA
    assert max(len(p) for p in pieces) <= 64 * 1024
    assert not inflater.cut_short


def test_a_stream_cut_short_gives_what_came_before_the_cut() -> None:
    """The end of a member missing: what it held before the cut, and cut_short."""
    whole = gzip.compress(DATA)
    inflater = Inflater(io.BytesIO(whole[: len(whole) // 2]))
    got = b"".join(inflater)
    assert inflater.cut_short
    assert 0 < len(got) < len(DATA)
    assert DATA.startswith(got)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", None),
        (gzip.compress(b"a\n") + gzip.compress(b"b\n"), None),
        (gzip.compress(DATA)[:-9], "a gzip stream cut short (its writer was killed?)"),
        (b"plain text\n", "not gzip-compressed data"),
        (gzip.compress(b"a\n") + b"garbage", "its compressed data is unreadable"),
    ],
)
def test_what_an_appending_writer_would_spoil(
    tmp_path: Path, content: bytes, says: str | None
) -> None:
    """Empty or complete members: nothing to say; cut short, not gzip, corrupt: why."""
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(content)
    found = incomplete(str(path))
    if says is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(says)
