"""The recording writer: what it writes (plain or gzip), what it leaves out, redaction, and a
queue that never makes the relay wait."""

from __future__ import annotations

import contextlib
import gzip
import os
import select
import subprocess
import threading
import time
from pathlib import Path

import orjson
import pytest
from harness import TIMEOUT
from tool_runs import acp_proxy, command, session_run

from proxy.core.errors import StartupError, UnusableFileError
from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Message, parse
from proxy.core.observations import Connected, Disconnected, Observation, Relayed, RelayedRun
from proxy.core.redact import REDACTED, Redactor, parse_pattern
from proxy.core.splice import MAX_STEPS
from proxy.shell.limits import LimitReached
from proxy.shell.recorder import RecordWriter
from proxy.tools.replay.files import load_recording  # what reads it back

SECRET = "sk-live-0123456789"
PROMPT = (
    b'{"jsonrpc":"2.0","id":"c1","method":"session/prompt","params":{"sessionId":"s",'
    b'"prompt":[{"type":"text","text":"use ' + SECRET.encode() + b'"}],"n":1.10}}'
)
ANSWER = b'{"jsonrpc":"2.0","id":0,"result":{"messageId":"m","big":123456789012345678901234567890}}'
UPDATE = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{}}}'


def parsed(raw: bytes) -> Message:
    message = parse(raw)
    assert isinstance(message, Message)
    return message


def relayed(
    raw: bytes, direction: Direction, ids: tuple[bytes | None, bytes | None], *, copy: bool = False
) -> Relayed:
    message = parsed(raw)
    return Relayed(
        direction=direction,
        kind=message.kind,
        method=message.method,
        session=message.session,
        size=len(raw),
        original_id=ids[0],
        forwarded_id=ids[1],
        message=message,
        copy=copy,
    )


def conversation() -> list[Observation]:
    return [
        Connected(Side.CLIENT, "stdio"),
        relayed(PROMPT, Direction.TO_AGENT, (b'"c1"', b"0")),
        relayed(PROMPT, Direction.TO_AGENT, (b'"c1"', b"1"), copy=True),  # a duplicate rule's
        RelayedRun(
            direction=Direction.TO_CLIENT,
            method="session/update",
            size=2 * len(UPDATE),
            raws=[UPDATE, UPDATE],
            bodies=[parsed(UPDATE).body, parsed(UPDATE).body],
        ),
        relayed(ANSWER, Direction.TO_CLIENT, (b'"c1"', b"0")),
        Disconnected(Side.CLIENT, "stdio"),
    ]


@pytest.mark.parametrize("name", ["session.jsonl", "session.jsonl.gz"])
def test_every_message_both_ways_is_recorded(tmp_path: Path, name: str) -> None:
    """Bodies byte for byte with their link, direction and ids; a run of notifications a line
    each; an injected copy left out; gzip when the name says so."""
    path = tmp_path / name
    writer = RecordWriter(path, clock=lambda: 12.5)
    for observation in conversation():
        writer.observe(observation, 4)
    writer.close()
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    recording = load_recording(path)
    assert [r.message.raw for r in recording.messages] == [PROMPT, UPDATE, UPDATE, ANSWER]
    assert [r.direction for r in recording.messages] == [
        Direction.TO_AGENT,
        Direction.TO_CLIENT,
        Direction.TO_CLIENT,
        Direction.TO_CLIENT,
    ]
    assert recording.messages[0].pair == recording.messages[3].pair == (b'"c1"', b"0")
    assert {r.link for r in recording.messages} == {4}
    assert [(e.event, e.side) for e in recording.links] == [
        ("open", Side.CLIENT),
        ("close", Side.CLIENT),
    ]
    assert writer.written == 7  # the header, two link lines, four messages
    assert path.stat().st_mode & 0o777 == 0o600  # what the peers said: its owner's alone


def test_redaction_leaves_no_secret_in_the_file(tmp_path: Path) -> None:
    """The secret is nowhere in the file's bytes; the file says what was redacted, and where."""
    path = tmp_path / "session.jsonl"
    writer = RecordWriter(path, Redactor.of([r"sk-live-\w+"]))
    for observation in conversation():
        writer.observe(observation, 1)
    writer.close()
    data = path.read_bytes()
    assert SECRET.encode() not in data
    recording = load_recording(path)
    assert recording.redactions == (parse_pattern(r"sk-live-\w+").describe(),)
    prompt = recording.messages[0]
    assert prompt.redacted == ("params.prompt[0].text",)
    assert prompt.message.raw == PROMPT.replace(SECRET.encode(), b"[redacted]")


def test_no_secret_in_the_ids_nor_in_the_header(tmp_path: Path) -> None:
    """A request id a pattern names is redacted in the body and in the line's own ``id`` and
    ``forwarded_id``, the same way on the request and its answer (they still pair up, two
    requests stay two); the header names the expressions by digest only."""
    path = tmp_path / "session.jsonl.gz"
    ids = [b'"sk-IDVALUE4444"', b'"sk-IDVALUE5555"']
    writer = RecordWriter(path, Redactor.of(["sk-[A-Za-z0-9]+", "hunter2XYZ"], key=b"k" * 32))
    for number, request_id in enumerate(ids):
        request = PROMPT.replace(b'"c1"', request_id)
        forwarded = str(number).encode()
        writer.observe(relayed(request, Direction.TO_AGENT, (request_id, request_id)), 1)
        answer = ANSWER.replace(b'"id":0', b'"id":' + request_id)
        writer.observe(relayed(answer, Direction.TO_CLIENT, (request_id, forwarded)), 1)
    writer.close()
    data = gzip.decompress(path.read_bytes())
    for secret in (b"IDVALUE", b"hunter2XYZ", SECRET.encode()):
        assert secret not in data
    messages = load_recording(path).messages
    first, second = messages[0].pair, messages[2].pair
    assert messages[1].pair == (first[0], b"0")
    assert messages[3].pair == (second[0], b"1")
    assert first[0] != second[0]
    assert orjson.loads(first[0]).startswith(REDACTED + "#")
    assert messages[0].message.body["id"] == orjson.loads(first[0])


class StalledRedactor(Redactor):
    """A redactor whose first call waits until the test lets it go (the disk of a slow writer)."""

    def __init__(self) -> None:
        super().__init__([])
        self.entered = threading.Event()
        self.go = threading.Event()

    def redact(self, raw: bytes) -> tuple[bytes, list[str]]:
        self.entered.set()
        assert self.go.wait(TIMEOUT)
        return raw, []


class Seen:
    def __init__(self) -> None:
        self.observations: list[Observation] = []

    def observe(self, observation: Observation, link: int | None = None) -> None:
        self.observations.append(observation)


def test_a_writer_behind_drops_and_counts_never_waits(tmp_path: Path) -> None:
    """A full queue: the message is left out, counted and observed; the relay goes on; what
    was queued is written once the writer catches up."""
    path = tmp_path / "session.jsonl"
    redactor = StalledRedactor()
    seen = Seen()
    writer = RecordWriter(path, redactor, backlog=2, observer=seen)
    answer = relayed(ANSWER, Direction.TO_CLIENT, (b"1", b"0"))
    writer.observe(answer, 1)
    assert redactor.entered.wait(TIMEOUT)  # the thread holds the first one
    for _ in range(5):
        writer.observe(answer, 1)  # two queued, three left out: none of it waits
    assert writer.dropped == 3
    assert seen.observations == [LimitReached("record_backlog", "link")] * 3
    redactor.go.set()
    writer.close()
    assert len(load_recording(path).messages) == 3


def test_the_file_is_opened_as_the_trace_is(tmp_path: Path) -> None:
    """A symbolic link or a FIFO in its place is refused, naming --record."""
    target = tmp_path / "target"
    target.write_text("")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with pytest.raises(StartupError, match=r"--record .*symbolic link"):
        RecordWriter(link)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(StartupError, match=r"--record .*not a regular file"):
        RecordWriter(fifo)


def test_a_run_records_both_ways_and_redacts(tmp_path: Path) -> None:
    """``acp-proxy run --record --redact``: the reference Client's session, both ways, and the
    prompt's text nowhere in the file's bytes (nor in the Agent's echo of it), nor the patterns."""
    path = tmp_path / "session.jsonl"
    redact = ["--redact", "hel+o", "--redact", "hunter2XYZ"]
    agent = command("run", "--record", str(path), *redact, "--", *command("agent"))
    done = session_run("client", "--", *agent)
    assert done.returncode == 0, done.stderr
    data = path.read_bytes()
    assert b"hello" not in data
    assert b"hunter2XYZ" not in data  # the header says the expression by its digest
    assert b"[redacted]" in data
    recording = load_recording(path)
    assert recording.redactions == (
        parse_pattern("hel+o").describe(),
        parse_pattern("hunter2XYZ").describe(),
    )
    assert {r.direction for r in recording.messages} == {Direction.TO_AGENT, Direction.TO_CLIENT}
    assert any(r.redacted == ("params.prompt[0].text",) for r in recording.messages)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--record", "r.jsonl", "--redact", "re:("], "not a regular expression"),
        (["--redact", "secret"], "give --record FILE"),
        (["--record", "-"], "give the recording a file"),
        (["--record", "r.jsonl", "--redact", "z*"], "'z*' matches the empty string"),
    ],
)
def test_record_options_are_checked(tmp_path: Path, options: list[str], says: str) -> None:
    """A bad pattern, one that matches the empty string, --redact without --record, a
    recording to stdout: a usage error (2), its error on one line."""
    done = acp_proxy("run", *options, "--", "true")
    assert done.returncode == 2
    (error,) = [line for line in done.stderr.splitlines() if "Error" in line]
    assert says in error, done.stderr


def test_a_message_too_large_to_redact_is_left_out(tmp_path: Path) -> None:
    """More elements in one array than a walk takes: the message is not written (it may hold
    the secret), counted; the messages after it are written."""
    path = tmp_path / "session.jsonl"
    writer = RecordWriter(path, Redactor.of([r"sk-live-\w+"]))
    items = b",".join([b'"' + SECRET.encode() + b'"'] * (MAX_STEPS + 1))
    huge = b'{"jsonrpc":"2.0","method":"session/update","params":{"items":[' + items + b"]}}"
    writer.observe(relayed(huge, Direction.TO_CLIENT, (None, None)), 1)
    writer.observe(relayed(UPDATE, Direction.TO_CLIENT, (None, None)), 1)
    writer.close()
    assert SECRET.encode() not in path.read_bytes()
    assert writer.unredactable == 1
    assert [r.message.raw for r in load_recording(path).messages] == [UPDATE]


# -- a .gz recording that is there already ----------------------------------------------------

INITIALIZE = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'


def test_a_proxy_killed_while_it_recorded_leaves_a_gzip_that_replays(tmp_path: Path) -> None:
    """``kill -KILL`` of a proxy recording to .gz: its member has no end, yet every line it
    flushed is read back (with a warning); a proxy started again on that file refuses it in one
    line (exit 2) instead of making it unreadable, and the file is left as it was."""
    path = tmp_path / "k.jsonl.gz"
    proxy = subprocess.Popen(
        command("run", "--record", str(path), "--", *command("agent")),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proxy.stdin is not None
        assert proxy.stdout is not None
        proxy.stdin.write(INITIALIZE + b"\n")
        proxy.stdin.flush()
        ready, _, _ = select.select([proxy.stdout], [], [], TIMEOUT)
        assert ready
        assert b'"result"' in proxy.stdout.readline()
        deadline = time.monotonic() + TIMEOUT
        warnings: list[str] = []
        while True:  # the recorder writes on a thread of its own: wait for its answer line
            with contextlib.suppress(Exception):
                if len(load_recording(path, warn=warnings.append).messages) == 2:
                    break
            assert time.monotonic() < deadline, "the answer was never recorded"
            select.select([], [], [], 0.05)
    finally:
        proxy.kill()
        proxy.wait(TIMEOUT)
        for pipe in (proxy.stdin, proxy.stdout):
            if pipe is not None:
                pipe.close()
    assert "cut short" in warnings[-1]
    before = path.read_bytes()
    done = acp_proxy("run", "--record", str(path), "--", "true")
    assert done.returncode == 2
    assert done.stderr == (
        f"acp-proxy: --record {path}: a gzip stream cut short (its writer was killed?): "
        "appending would make it unreadable; move it away, or record to another file\n"
    )
    assert path.read_bytes() == before


def test_a_gz_that_is_no_gzip_is_not_appended_to(tmp_path: Path) -> None:
    """Plain text named .gz: refused, untouched; a complete .gz gets a member of its own, and
    both runs are read back."""
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_bytes(b"hello\n")
    with pytest.raises(UnusableFileError, match="not gzip-compressed data"):
        RecordWriter(plain)
    assert plain.read_bytes() == b"hello\n"
    path = tmp_path / "r.jsonl.gz"
    for _ in range(2):
        writer = RecordWriter(path)
        writer.observe(relayed(PROMPT, Direction.TO_AGENT, (b'"c1"', b"0")), link=1)
        writer.close()
    assert len(load_recording(path).messages) == 2


@pytest.mark.parametrize("option", ["--record", "--trace"])
def test_a_directory_or_a_missing_one_is_one_line(tmp_path: Path, option: str) -> None:
    """The same mistakes, the same answers for both files: one line each, naming the option;
    a directory given as the file is a usage error (2), a file in a directory that is not there
    cannot be opened (1)."""
    done = acp_proxy("run", option, str(tmp_path), "--", "true")
    assert (done.returncode, done.stderr) == (
        2,
        f"acp-proxy: {option} {tmp_path}: a directory; give a file\n",
    )
    missing = tmp_path / "nowhere" / "x.jsonl"
    done = acp_proxy("run", option, str(missing), "--", "true")
    assert (done.returncode, done.stderr) == (
        1,
        f"acp-proxy: {option} {missing}: no such file or directory\n",
    )
