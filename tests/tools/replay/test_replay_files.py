"""Reading a recording file: gzip or plain, bounded, every problem located."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from proxy.core.events import Direction
from proxy.core.recording import RecordingError, header_line, message_line
from proxy.tools.replay.files import load_recording

ANSWER = b'{"jsonrpc":"2.0","id":0,"result":{}}'


def write(path: Path, *lines: bytes) -> Path:
    data = b"".join(line + b"\n" for line in lines)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def message(link: int = 1) -> bytes:
    return message_line(1.0, link, Direction.TO_CLIENT, (b"1", b"0"), ANSWER)


@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.gz", "r.gz-without-the-name"])
def test_plain_or_gzip_by_its_first_bytes(tmp_path: Path, name: str) -> None:
    """Compressed or not, whatever the name: the first bytes say."""
    path = tmp_path / name
    data = header_line(0.0) + b"\n" + message() + b"\n"
    path.write_bytes(gzip.compress(data) if "gz" in name else data)
    assert [r.message.raw for r in load_recording(path).messages] == [ANSWER]


def test_runs_appended_to_one_file_keep_their_links_apart(tmp_path: Path) -> None:
    """A second header (a respawned proxy appending): its link 1 is not the first run's."""
    path = write(tmp_path / "r.jsonl", header_line(0.0), message(), header_line(5.0), message())
    first, second = load_recording(path).messages
    assert first.link != second.link


def test_a_gzip_file_cut_short_is_said(tmp_path: Path) -> None:
    """A compressed file cut in the middle: named, with why."""
    whole = gzip.compress(header_line(0.0) + b"\n" + message() * 200 + b"\n")
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(RecordingError, match=r"cut.jsonl.gz: compressed data unreadable"):
        load_recording(path)


def test_a_line_too_long_is_skipped_and_located(tmp_path: Path) -> None:
    """A line over the bound is never held whole: it is named, and the lines after it read."""
    path = write(tmp_path / "r.jsonl", header_line(0.0), b"x" * 5000, message(), b"y" * 3000)
    with pytest.raises(RecordingError) as caught:
        load_recording(path, max_line_bytes=1000)
    assert [str(p) for p in caught.value.problems] == [
        "line 2: longer than 1000 bytes; not read",
        "line 4: longer than 1000 bytes; not read",
    ]


def test_a_huge_recording_stops_at_its_bound(tmp_path: Path) -> None:
    """Past the bytes a replay holds, the reading stops with where."""
    path = write(tmp_path / "r.jsonl.gz", header_line(0.0), *[message()] * 100)
    with pytest.raises(RecordingError, match=r"line \d+: the recording holds more than 2000 bytes"):
        load_recording(path, max_bytes=2000)


def test_a_missing_file_is_said(tmp_path: Path) -> None:
    """A file that cannot be opened: one problem, its cause."""
    with pytest.raises(RecordingError, match="cannot be read: no such file or directory"):
        load_recording(tmp_path / "absent.jsonl")
