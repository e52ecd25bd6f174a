"""Reading a recording file: gzip or plain, bounded, every problem located."""

from __future__ import annotations

import gzip
import random
import zlib
from pathlib import Path

import orjson
import pytest

from proxy.core.events import Direction
from proxy.core.recording import RecordingError, header_line, message_line
from proxy.tools.replay.files import load_recording, load_replayable

ANSWER = b'{"jsonrpc":"2.0","id":0,"result":{}}'


def write(path: Path, *lines: bytes) -> Path:
    data = b"".join(line + b"\n" for line in lines)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def request(link: int = 1) -> bytes:
    raw = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}'
    return message_line(0.5, link, Direction.TO_AGENT, (b"1", b"0"), raw)


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


def test_a_gzip_file_cut_short_gives_its_complete_lines_with_a_warning(tmp_path: Path) -> None:
    """A proxy killed while it recorded leaves its gzip member without its end: the complete
    lines before the cut are read (as zcat shows them), the one cut dropped, and a warning
    says so."""
    noise = random.Random(2)
    answers = [  # each unlike the others: the compressed data grows with them
        message_line(
            1.0,
            1,
            Direction.TO_CLIENT,
            (b"1", b"0"),
            orjson.dumps({"jsonrpc": "2.0", "id": 0, "result": {"n": noise.random()}}),
        )
        for _ in range(2000)
    ]
    data = header_line(0.0) + b"\n" + request() + b"\n" + b"".join(a + b"\n" for a in answers)
    whole = gzip.compress(data)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    inflated = zlib.decompressobj(31).decompress(whole[: len(whole) // 2])  # what zcat shows
    complete = inflated.count(b"\n")
    assert 2 < complete < 2002
    assert not inflated.endswith(b"\n")  # the cut falls inside a line
    warnings: list[str] = []
    recording = load_recording(path, warn=warnings.append)
    assert len(recording.messages) == complete - 1  # the header aside; the line cut dropped
    assert warnings == [
        f"{path}: warning: the compressed data is cut short (a proxy killed while it recorded?); "
        f"its {complete} complete lines are read"
    ]


def test_runs_appended_to_a_gzip_file_cut_short_are_read(tmp_path: Path) -> None:
    """A run killed, then another appending its member: both runs' messages are read."""
    first = gzip.compress(header_line(0.0) + b"\n" + request() + b"\n" + message() + b"\n")
    second = gzip.compress(header_line(5.0) + b"\n" + message() + b"\n")
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(first + second)
    assert len(load_recording(path).messages) == 3


def test_corrupt_compressed_data_is_said(tmp_path: Path) -> None:
    """Compressed data that cannot be inflated: one problem, why."""
    whole = bytearray(gzip.compress(header_line(0.0) + b"\n" + (message() + b"\n") * 200))
    whole[20:40] = b"\xff" * 20
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(bytes(whole))
    with pytest.raises(RecordingError, match=r"bad.jsonl.gz: compressed data unreadable"):
        load_recording(path)


@pytest.mark.parametrize("name", ["random.jsonl", "random.jsonl.gz"])
def test_a_file_that_is_no_recording_is_one_line(tmp_path: Path, name: str) -> None:
    """Random bytes, or a text log: its first line is no header, so it is said once, whatever
    the lines after it hold."""
    path = tmp_path / name
    path.write_bytes(random.Random(1).randbytes(100_000))
    with pytest.raises(RecordingError) as caught:
        load_recording(path)
    assert len(str(caught.value).splitlines()) == 1
    assert "line 1: not a recording" in str(caught.value)
    log = tmp_path / "app.log"
    log.write_text("".join(f"2026-12-06 INFO something {n}\n" for n in range(20_000)))
    with pytest.raises(RecordingError) as caught:
        load_recording(log)
    assert str(caught.value) == f"{log}: line 1: not a recording: its first line is not JSON"


@pytest.mark.parametrize("line_bound", [64 * 1024 * 1024, 1000], ids=["kept", "skipped"])
def test_a_gzip_bomb_stops_at_the_bound_without_inflating_the_rest(
    tmp_path: Path, line_bound: int
) -> None:
    """The bound counts decompressed bytes as they come, a line being skipped too: a file
    inflating past it stops there, inside its line 2, before the corrupt data placed after the
    bound is ever inflated."""
    body = header_line(0.0) + b"\n" + b"x" * (8 * 1024 * 1024)
    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(gzip.compress(body) + b"\x1f\x8bnot gzip at all")
    with pytest.raises(RecordingError) as caught:
        load_recording(path, max_bytes=1024 * 1024, max_line_bytes=line_bound)
    assert str(caught.value).splitlines()[-1] == (
        f"{path}: line 2: the recording holds more than {1024 * 1024} bytes; not read further"
    )


def test_nothing_to_replay_is_refused(tmp_path: Path) -> None:
    """A header alone (or the Agent's messages alone): no message of the Client to replay."""
    path = write(tmp_path / "hdronly.jsonl", header_line(0.0))
    with pytest.raises(RecordingError, match="nothing to replay"):
        load_replayable(path)
    assert load_replayable(write(tmp_path / "r.jsonl", header_line(0.0), request())).messages


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
