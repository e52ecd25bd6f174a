"""`acp-proxy run` over stdio end to end: a real proxy process, a real Agent process, raw bytes."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType

import pytest
from harness import (
    TIMEOUT,
    Start,
    captured,
    log_events,
    raw_agent,
    say,
    system_pipe_max,
    system_pipe_size,
)
from stdio_scenario import barrier

from proxy.control import ControlClient
from proxy.shell.defaults import PIPE_BYTES, WRITE_SLICE
from proxy.shell.transports.pipes import ArrivingReader
from proxy.shell.transports.stdio import (
    IN_PLACE_LINES,
    LineStream,
    _lines_over,
    send_signal,
    spawn_agent,
)

CLIENT_MESSAGES: list[tuple[bytes, bytes | None]] = [
    # (what the Client sends, the id the Agent must see instead of the Client's; None: unchanged)
    (b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}', b"0"),
    (
        b'{"jsonrpc":"2.0","id":"0","method":"session/prompt","params":{"sessionId":"S","idempotencyKey":"0b6f3c1e-8d2a-4c57-9a41-5e2f7d90c3ab","prompt":[{"type":"text","text":"Run the migration"}],"_meta":{"traceparent":"00-abc"}}}',
        b"1",
    ),
    (
        b'{ "params" : {"text":"esc \\" \\\\ \\u00e9 \\ud83d\\ude00 \xc3\xa9","n":123456789012345678901234567890,"f":1e400,"d":1,"d":2}, "id" : 123456789012345678901234567890 , "method":"_x/odd"}',
        b"2",
    ),
    (b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"S"}}', None),
    (b'{"jsonrpc":"2.0","method":"_custom/note","params":{"lone":"\\ud800"}}', None),
]


async def test_agent_sees_client_messages_byte_for_byte_but_the_id(
    start: Start, capture: Path
) -> None:
    """Capture: every message on the Agent's side equals the Client's, except the id."""
    proxy = await start(raw_agent(capture))
    await proxy.send(*(message for message, _ in CLIENT_MESSAGES))
    answers = [await proxy.recv_json() for _ in range(3)]
    assert [a["id"] for a in answers] == [0, "0", 123456789012345678901234567890]
    assert await barrier(proxy, "b") == []
    seen = captured(capture)
    assert len(seen) == len(CLIENT_MESSAGES) + 1
    for (sent, new_id), got in zip(CLIENT_MESSAGES, seen, strict=False):
        if new_id is None:
            assert got == sent
        else:
            old_id = json.loads(sent)["id"]
            old_token = json.dumps(old_id).encode()
            assert got == sent.replace(b'"id":' + old_token, b'"id":' + new_id).replace(
                b'"id" : ' + old_token, b'"id" : ' + new_id
            )


async def test_client_sees_agent_messages_byte_for_byte_but_the_id(
    start: Start, capture: Path
) -> None:
    """Capture, the other way: Agent requests get the proxy's ids; answers get the Client's ids."""
    proxy = await start(raw_agent(capture))
    update = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S","update":{"sessionUpdate":"agent_message_chunk","messageId":"m1","content":{"type":"text","text":"\\u00e9\xc3\xa9"}}}}'
    permission = b'{"jsonrpc":"2.0","id":"perm-1","method":"session/request_permission","params":{"sessionId":"S","options":[{"optionId":"allow","name":"Allow","kind":"allow_once"}]}}'
    await proxy.send(say(update, permission))
    assert await proxy.recv() == update
    assert await proxy.recv() == permission.replace(b'"perm-1"', b"0")
    # The Client answers under the proxy's id; the Agent gets its own id back.
    answer = (
        b'{"jsonrpc":"2.0","id":0,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}'
    )
    await proxy.send(answer)
    assert await barrier(proxy, "b") == []
    assert captured(capture)[-2] == answer.replace(b'"id":0', b'"id":"perm-1"')


async def test_messages_of_tens_of_mebibytes_cross_both_ways(start: Start, capture: Path) -> None:
    """A 24 MiB prompt reaches the Agent whole and a 24 MiB update reaches the Client whole."""
    proxy = await start(raw_agent(capture))
    text = "x" * (24 * 1024 * 1024)
    prompt = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {"prompt": text}}
    ).encode()
    await proxy.send(prompt)
    answer = await proxy.recv_json()
    assert answer == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"method": "session/prompt", "size": len(prompt)},
    }
    update = json.dumps(
        {"jsonrpc": "2.0", "method": "session/update", "params": {"t": text}}
    ).encode()
    await proxy.send(say(update))
    assert await proxy.recv() == update


async def test_oversized_message_gets_an_error_and_the_link_goes_on(
    start: Start, capture: Path
) -> None:
    """Over --max-message-bytes: the sender gets -32600 naming the sizes; nothing is forwarded."""
    proxy = await start(raw_agent(capture), "--max-message-bytes", "1000")
    big = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "m", "params": "y" * 2000}).encode()
    await proxy.send(big)
    error = await proxy.recv_json()
    assert error["id"] is None
    assert error["error"]["code"] == -32600
    assert "1000" in error["error"]["message"]
    assert await barrier(proxy, "after") == []
    assert all(b'"yyy' not in line for line in captured(capture))
    assert "too_large" in proxy.stderr


async def test_deeply_nested_messages_do_not_stall_the_proxy(start: Start, capture: Path) -> None:
    """Two 60 MB messages nested millions of levels deep (one closed, one never closed) go on
    to the Agent, and the control API answers while they are handled: the scanner walks runs of
    brackets in a step (it once walked them level by level, for a minute per message)."""
    proxy = await start(raw_agent(capture), "--log-format", "json", "--admin", "127.0.0.1:0")
    control = ControlClient((await proxy.logged("control API listening"))["url"])
    depth = 30_000_000
    head = b'{"jsonrpc":"2.0","id":7,"method":"_x/deep","params":'
    closed = head + b"[" * depth + b"]" * depth + b"}"
    unclosed = head + b"[" * 2 * depth + b"}"
    await proxy.send(closed, unclosed)
    async with asyncio.timeout(TIMEOUT):
        health = await asyncio.to_thread(control.health)
    assert health["status"] == "ok"
    assert await barrier(proxy, "after") == []
    assert [len(line) for line in captured(capture)[:2]] == [len(closed), len(unclosed)]


async def test_invalid_input_is_forwarded_untouched_by_default(start: Start, capture: Path) -> None:
    """Malformed JSON and invalid UTF-8 reach the Agent as they were, and are logged; a request
    id a lenient Agent could read is the proxy's own, like any, and the answer a lenient Agent
    gives under it comes back under the Client's id."""
    proxy = await start(raw_agent(capture))
    await proxy.send(b"{not json", b'{"id":1,"method":"\xff\xfe"}')
    assert await barrier(proxy, "b") == []
    assert captured(capture)[:2] == [b"{not json", b'{"id":0,"method":"\xff\xfe"}']
    assert "invalid_json" in proxy.stderr
    assert "not_utf8" in proxy.stderr
    await proxy.send(say(b'{"jsonrpc":"2.0","id":0,"result":{"lenient":true}}'))
    assert json.loads(await proxy.recv()) == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"lenient": True},
    }


async def test_strict_mode_answers_invalid_input_itself(start: Start, capture: Path) -> None:
    """With --strict the Client gets -32700 and the Agent never sees the bad line."""
    proxy = await start(raw_agent(capture), "--strict")
    await proxy.send(b"{not json")
    error = await proxy.recv_json()
    assert (error["id"], error["error"]["code"]) == (None, -32700)
    assert await barrier(proxy, "b") == []
    assert b"{not json" not in captured(capture)


async def test_agent_output_that_is_invalid_reaches_the_client(start: Start, capture: Path) -> None:
    """An Agent's unparsable line goes to the Client, who answers it as without a proxy."""
    proxy = await start(raw_agent(capture))
    await proxy.send(say(b"garbage \xff", b'{"jsonrpc":"2.0","id":77,"result":{}}'))
    assert await proxy.recv() == b"garbage \xff"
    # the orphan response with id 77 was dropped, not delivered
    assert await barrier(proxy, "b") == []
    assert "response with unknown id dropped" in proxy.stderr


async def test_agent_exit_status_becomes_the_proxys(start: Start, capture: Path) -> None:
    """The Agent dies with a request pending: the Client's stdout ends, the status is passed on."""
    proxy = await start(raw_agent(capture))
    await proxy.send(b'{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{}}')
    await proxy.recv_json()
    await proxy.send(
        b'{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{}}',
        b'{"jsonrpc":"2.0","method":"_test/exit","params":{"code":3}}',
    )
    assert (await proxy.recv_json())["id"] == 2
    assert await proxy.at_eof()
    assert await proxy.wait() == 3
    assert "peer disconnected" in proxy.stderr
    (exited,) = log_events(proxy.stderr, "the agent exited")  # said, not only in the status
    assert (exited["level"], exited["exit_status"]) == ("warning", 3)


async def test_agent_killed_by_a_signal_is_reported_like_a_shell(
    start: Start, tmp_path: Path
) -> None:
    """An Agent killed by SIGKILL makes the proxy exit 137."""
    proxy = await start(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    )
    assert await proxy.wait() == 128 + signal.SIGKILL


async def test_client_closing_stdin_shuts_the_agent_down(start: Start, capture: Path) -> None:
    """EOF from the Client closes the Agent's stdin; the Agent's last answers still arrive."""
    proxy = await start(raw_agent(capture))
    await proxy.send(b'{"jsonrpc":"2.0","id":"last","method":"m"}')
    await proxy.close_stdin()
    assert (await proxy.recv_json())["id"] == "last"
    assert await proxy.at_eof()
    assert await proxy.wait() == 0


async def test_an_agent_ignoring_eof_is_stopped_after_the_grace_period(
    start: Start, capture: Path
) -> None:
    """An Agent that keeps running after stdin closes is terminated; the proxy still exits 0."""
    proxy = await start(raw_agent(capture, "--ignore-eof"), "--agent-grace", "0.2")
    await proxy.close_stdin()
    assert await proxy.wait() == 0
    assert "agent did not exit in time" in proxy.stderr


async def test_sigterm_is_passed_to_the_agent(start: Start, capture: Path) -> None:
    """SIGTERM to the proxy reaches the Agent; the proxy exits with the Agent's status."""
    proxy = await start(raw_agent(capture))
    assert await barrier(proxy, "ready") == []
    proxy.process.send_signal(signal.SIGTERM)
    assert await proxy.wait() == 128 + signal.SIGTERM
    assert "signal received" in proxy.stderr


async def test_stderr_and_environment_pass_through(start: Start, capture: Path) -> None:
    """The Agent's stderr is the proxy's stderr; its environment is the proxy's."""
    os.environ["ACP_PROXY_TEST_MARKER"] = "marker-value"
    try:
        proxy = await start(raw_agent(capture))
    finally:
        del os.environ["ACP_PROXY_TEST_MARKER"]
    await proxy.send(
        b'{"jsonrpc":"2.0","method":"_test/stderr","params":{"text":"agent says hello"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"_test/env","params":{"name":"ACP_PROXY_TEST_MARKER"}}',
    )
    assert (await proxy.recv_json())["result"] == {"value": "marker-value"}
    await proxy.close_stdin()
    assert await proxy.wait() == 0
    assert "agent says hello" in proxy.stderr


PIPES = b'{"jsonrpc":"2.0","id":1,"method":"_test/pipes"}'


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="Linux's pipe sizes")
async def test_every_pipe_of_a_stdio_proxy_is_widened(start: Start, capture: Path) -> None:
    """The pipes the Client gave the proxy and those to its Agent hold ``PIPE_BYTES`` each: a
    64 KiB prompt crosses each in one write."""
    proxy = await start(raw_agent(capture))
    await proxy.send(PIPES)
    assert (await proxy.recv_json())["result"] == {"stdin": PIPE_BYTES, "stdout": PIPE_BYTES}
    # The test's own ends of the proxy's stdin and stdout (asyncio keeps them on its transport).
    pipes = proxy.process._transport  # type: ignore[attr-defined]
    client_ends = [pipes.get_pipe_transport(fd).get_extra_info("pipe") for fd in (0, 1)]
    sizes = [fcntl.fcntl(end.fileno(), fcntl.F_GETPIPE_SZ) for end in client_ends]
    assert sizes == [PIPE_BYTES, PIPE_BYTES]


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="Linux's pipe sizes")
async def test_pipe_bytes_0_leaves_the_pipes_as_the_system_made_them(
    start: Start, capture: Path
) -> None:
    proxy = await start(raw_agent(capture), "--pipe-bytes", "0")
    await proxy.send(PIPES)
    made = system_pipe_size()
    assert (await proxy.recv_json())["result"] == {"stdin": made, "stdout": made}


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="Linux's pipe sizes")
async def test_pipes_asked_past_what_the_system_allows_are_logged_and_work(
    start: Start, capture: Path
) -> None:
    """2 GB a pipe: refused (past ``pipe-max-size``, or more than the kernel will allocate). Each
    pipe gets ``pipe-max-size``, the proxy says so, once for each peer, and relays through them."""
    asked = 2_000_000_000
    most = system_pipe_max()
    proxy = await start(raw_agent(capture), "--pipe-bytes", str(asked), "--log-format", "json")
    await proxy.send(PIPES)
    assert (await proxy.recv_json())["result"] == {"stdin": most, "stdout": most}
    await proxy.close_stdin()
    assert await proxy.wait() == 0
    kept = [
        event
        for event in map(json.loads, proxy.stderr.splitlines())
        if event["event"].startswith("pipes kept smaller")
    ]
    assert sorted((e["peer"], e["asked"], e["from_peer"], e["to_peer"]) for e in kept) == [
        ("agent", asked, most, most),
        ("client", asked, most, most),
    ]


async def test_what_the_agent_writes_is_taken_in_the_read_of_its_pipe(capture: Path) -> None:
    """The Agent's stdout is read as the Client's stdin is: a chunk reaches the reader (and the
    relay) inside the callback that read it from the pipe. asyncio's subprocess pipes hand each
    chunk on through one more turn of the event loop (``call_soon``): a system call and a turn
    on the way of every answer. Told by the frames the chunk is taken under."""
    agent = await spawn_agent(raw_agent(capture), limit=1 << 20)
    read_transport = agent._read_transport
    taken_in: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()

    def take(data: bytes) -> bool:
        callers = []
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_locals.get("self") is read_transport:
                callers.append(frame.f_code.co_name)
            frame = frame.f_back
        if not taken_in.done():
            taken_in.set_result(callers)
        return False  # into the reader's buffer, as if nobody took it

    reader = agent._reader
    assert isinstance(reader, ArrivingReader)
    reader.take = take
    try:
        agent.send(b'{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{}}')
        agent.flush()
        assert await asyncio.wait_for(taken_in, TIMEOUT) == ["_read_ready"]
    finally:
        agent.close()
        await agent.wait_closed()


def open_descriptors() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="open descriptors from /proc")
async def test_an_agent_that_cannot_start_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """The proxy's ends of the Agent's pipes are connected before it starts: when it cannot
    start, they are closed with the child's ends (a respawn that fails must not leak four
    descriptors each time)."""
    before = open_descriptors()
    with pytest.raises(FileNotFoundError):
        await spawn_agent([str(tmp_path / "no-such-agent")], limit=1 << 20)
    for _ in range(2):  # a transport closes its pipe in the loop's next turn
        await asyncio.sleep(0)
    assert open_descriptors() <= before


async def test_stdout_carries_only_protocol_even_at_debug_level(
    start: Start, capture: Path
) -> None:
    """Logs go to stderr: at debug level stdout still holds nothing but the relayed messages."""
    proxy = await start(raw_agent(capture), "--log-level", "debug", "--log-format", "json")
    await proxy.send(b'{"jsonrpc":"2.0","id":1,"method":"m"}', b"{bad")
    assert (await proxy.recv_json())["id"] == 1
    assert await barrier(proxy, "b") == []
    await proxy.close_stdin()
    assert await proxy.at_eof()
    assert await proxy.wait() == 0
    for line in proxy.stderr.splitlines():
        event = json.loads(line)  # every log line is one JSON object
        assert "event" in event
    assert '"relayed"' in proxy.stderr


async def test_request_id_reused_while_pending_is_logged_and_relayed(
    start: Start, capture: Path
) -> None:
    """A Client reusing a pending id: both requests relayed, both answers carry it, reuse logged."""
    proxy = await start(raw_agent(capture))
    await proxy.send(
        b'[{"jsonrpc":"2.0","id":9,"method":"a"},{"jsonrpc":"2.0","id":9,"method":"b"}]'
    )
    assert await barrier(proxy, "b") == []
    assert (
        captured(capture)[0]
        == b'[{"jsonrpc":"2.0","id":0,"method":"a"},{"jsonrpc":"2.0","id":1,"method":"b"}]'
    )
    await proxy.send(
        say(b'{"jsonrpc":"2.0","id":1,"result":"b"}', b'{"jsonrpc":"2.0","id":0,"result":"a"}')
    )
    assert await proxy.recv_json() == {"jsonrpc": "2.0", "id": 9, "result": "b"}
    assert await proxy.recv_json() == {"jsonrpc": "2.0", "id": 9, "result": "a"}
    assert "request id reused while still pending" in proxy.stderr


async def test_missing_agent_command_exits_127(start: Start) -> None:
    """A command that does not exist is named in a clear error."""
    proxy = await start(["acp-proxy-no-such-agent"])
    assert await proxy.wait() == 127
    assert "agent command not found" in proxy.stderr
    assert "acp-proxy-no-such-agent" in proxy.stderr


async def test_send_signal_reaches_a_live_child_and_spares_a_reaped_one() -> None:
    """``send_signal`` signals by pid while the child is unreaped, and does nothing after: the exit
    status is the signal's, never the 255 of a child reaped behind asyncio's back."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)"
    )
    send_signal(child, signal.SIGTERM)
    assert await asyncio.wait_for(child.wait(), TIMEOUT) == -signal.SIGTERM
    send_signal(child, signal.SIGKILL)  # reaped: nothing to signal, nothing raised
    assert child.returncode == -signal.SIGTERM


async def test_a_large_message_is_written_into_the_pipe_a_slice_at_a_time() -> None:
    """A message of many MB goes into the pipe's buffer a slice at a time, each once the reader
    took the one before (copied in whole, it held every other link for tens of ms); it arrives
    whole and in order all the same."""
    stream, unused_write, read_end, write_transport = await _line_stream(limit=1 << 30)
    message = b'{"jsonrpc":"2.0","method":"_x/big","params":"' + b"y" * (16 * WRITE_SLICE) + b'"}'

    def read_all() -> bytes:
        data = bytearray()
        while len(data) < len(message) + 1:
            data += os.read(read_end, 1 << 20)
        return bytes(data)

    async def relay() -> None:  # as a link does: send, then drain in the same step
        stream.send(message)
        await stream.drain()

    try:
        async with asyncio.TaskGroup() as tasks:
            draining = tasks.create_task(relay())
            await asyncio.sleep(0)  # the drain wrote its first slice; the pipe is full, it waits
            assert not draining.done()
            assert write_transport.get_write_buffer_size() <= WRITE_SLICE
            assert stream.buffered() > 14 * WRITE_SLICE
            received = await asyncio.to_thread(read_all)
        assert received == message + b"\n"
    finally:
        stream.close()
        os.close(read_end)
        os.close(unused_write)


async def test_an_option_of_the_proxy_after_the_agent_command_is_warned_of(
    start: Start, tmp_path: Path
) -> None:
    """Everything after ``--`` goes to the Agent: an argument there that is an option of ``run``
    (``--trace``, ``--faults=...``) is warned of, as the Agent may ignore it silently; a proxy in
    front of a proxy is not."""
    agent = ["sh", "-c", "exec cat", "sh", "--trace", "t.jsonl", "--faults=f.yaml", "--x"]
    proxy = await start(agent)
    await proxy.close_stdin()
    assert await proxy.wait() == 0
    warned = log_events(
        proxy.stderr,
        "an argument of the Agent is an option of acp-proxy run; the proxy's options go before --",
    )
    assert [event["argument"] for event in warned] == ["--trace", "--faults"]
    trace = str(tmp_path / "t.jsonl")
    nested = await start([sys.executable, "-m", "proxy", "run", "--trace", trace, "--", "cat"])
    await nested.close_stdin()
    assert await nested.wait() == 0
    assert "an argument of the Agent" not in nested.stderr


async def _line_stream(limit: int) -> tuple[LineStream, int, int, asyncio.WriteTransport]:
    """A :class:`LineStream` over two real pipes: the fd to write what it reads, the fd to read
    what it writes, and its writing transport."""
    loop = asyncio.get_running_loop()
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    reader = ArrivingReader()
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_read, "rb", 0)
    )
    write_transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), os.fdopen(out_write, "wb", 0)
    )
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    stream = LineStream(reader, writer, read_transport, limit=limit, half_close=False)
    return stream, in_write, out_read, write_transport


async def test_lines_are_relayed_in_the_reads_callback_while_the_link_is_ready() -> None:
    """relay_in_place: while a receive waits and the link is ready, what arrives is framed and
    relayed in the read's callback (the receive goes on waiting); a message that is large (to
    be parsed elsewhere), or a link not ready, leaves the bytes to the receive, in order; lines
    handed back are received next; a stream's read (many lines) is framed as it comes, never
    through the reader's buffer, and received."""
    stream, feed, sink, _ = await _line_stream(limit=1000)
    relayed: asyncio.Queue[list[bytes]] = asyncio.Queue()
    ready = True
    give_back = 0

    def relay(lines: list[bytes]) -> None:
        relayed.put_nowait(lines)
        if give_back:
            stream.hand_over(lines[-give_back:])

    stream.relay_in_place(lambda: ready, relay, lambda data: b"large" in data, 5)
    try:
        receiving = asyncio.get_running_loop().create_task(stream.receive())
        os.write(feed, b"a\nb\npart")
        assert await asyncio.wait_for(relayed.get(), TIMEOUT) == [b"a", b"b"]
        os.write(feed, b"ial\n")  # completes the line begun in the last read
        assert await asyncio.wait_for(relayed.get(), TIMEOUT) == [b"partial"]
        assert not receiving.done()
        os.write(feed, b"a large one\nc\n")
        assert await asyncio.wait_for(receiving, TIMEOUT) == b"a large one"
        assert await stream.receive() == b"c"
        ready = False
        os.write(feed, b"d\n")
        assert await asyncio.wait_for(stream.receive(), TIMEOUT) == b"d"
        ready, give_back = True, 1
        receiving = asyncio.get_running_loop().create_task(stream.receive())
        os.write(feed, b"e\nf\n")
        assert await asyncio.wait_for(relayed.get(), TIMEOUT) == [b"e", b"f"]
        assert await asyncio.wait_for(receiving, TIMEOUT) == b"f"
        assert relayed.empty()
        give_back = 0
        stream_lines = [b"s%d" % n for n in range(IN_PLACE_LINES + 1)]  # a stream's read
        receiving = asyncio.get_running_loop().create_task(stream.receive())
        os.write(feed, b"".join(line + b"\n" for line in stream_lines))
        assert await asyncio.wait_for(receiving, TIMEOUT) == stream_lines[0]
        assert relayed.empty()
        assert not stream._reader._buffer  # type: ignore[attr-defined]  # framed as it came
        for line in stream_lines[1:]:
            assert await stream.receive() == line
    finally:
        stream.close()
        os.close(feed)
        os.close(sink)


async def test_lines_handed_back_come_before_what_the_wake_up_brings() -> None:
    """Lines the link hands back are received first even when the read that wakes the waiting
    receive brings more (here its end): nothing handed back is lost."""
    stream, feed, sink, _ = await _line_stream(limit=1000)
    reader = stream._reader
    assert isinstance(reader, ArrivingReader)

    def relay(lines: list[bytes]) -> None:
        stream.hand_over(lines)
        reader.feed_eof()  # before the waiting receive has run

    stream.relay_in_place(lambda: True, relay, lambda data: False, 1000)
    try:
        receiving = asyncio.get_running_loop().create_task(stream.receive())
        os.write(feed, b"a\nb\n")
        assert await asyncio.wait_for(receiving, TIMEOUT) == b"a"
        assert await stream.receive() == b"b"
        assert await stream.receive() is None
    finally:
        stream.close()
        os.close(feed)
        os.close(sink)


def _read_exactly(fd: int, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        data += os.read(fd, size - len(data))
    return bytes(data)


async def test_a_sliced_line_is_written_in_pieces_and_what_follows_waits_for_it() -> None:
    """``slice``: the line's first piece is written, the next waits its gap (nothing more is in
    the pipe meanwhile, not even the line sent after it); a sever that flushes writes the rest at
    once, in order."""
    stream, feed, sink, _ = await _line_stream(limit=100)
    message = b'{"jsonrpc":"2.0","method":"_x/sliced"}'
    try:
        stream.send(b"before")
        stream.send_sliced(message, (4,), 3600.0)
        stream.send(b"after")
        first = await asyncio.to_thread(_read_exactly, sink, len(b"before\n") + 4)
        assert first == b"before\n" + message[:4]
        os.set_blocking(sink, False)
        with pytest.raises(BlockingIOError):  # the second piece waits an hour
            os.read(sink, 100)
        assert stream.buffered() == len(message) - 4 + 1 + len(b"after\n")
        stream.sever(flush=True)
        os.set_blocking(sink, True)
        rest = await asyncio.to_thread(_read_exactly, sink, len(message) - 4 + 1 + 6)
        assert rest == message[4:] + b"\nafter\n"
    finally:
        stream.close()
        os.close(feed)
        os.close(sink)


async def test_closing_behind_a_sliced_line_waits_for_its_last_piece() -> None:
    stream, feed, sink, _ = await _line_stream(limit=100)
    message = b'{"jsonrpc":"2.0","method":"_x/sliced","params":{"pad":"xxxxxxxxxx"}}'
    try:
        stream.send_sliced(message, (3, 5, 7), 0.001)
        stream.send(b"last")
        stream.close()  # deferred until the pieces are written: nothing is lost
        await stream.wait_closed()
        received = await asyncio.to_thread(_read_all, sink)
        assert received == message + b"\nlast\n"
    finally:
        os.close(feed)
        os.close(sink)


def _read_all(fd: int) -> bytes:
    data = bytearray()
    while chunk := os.read(fd, 1 << 16):
        data += chunk
    return bytes(data)


async def test_the_lines_of_one_read_are_received_together_and_sent_in_one_write() -> None:
    """The lines one read brought are handed over at once (after the first), unless one was too
    large (its marker must be answered alone) or one is long enough to be parsed elsewhere; those
    the relay did not take are received again;
    a run of lines is queued in one copy, each line still a line of its own, and one that holds
    a raw newline (from another transport) is spaced as a single send is."""
    stream, feed, sink, _ = await _line_stream(limit=100)
    try:
        os.write(feed, b"one\ntwo\nthree\n")
        assert await stream.receive() == b"one"
        assert stream.receive_burst(below=100) == [b"two", b"three"]
        assert not stream.receive_ready()
        stream.give_back([b"three"])  # the relay took one: the other is received again
        assert stream.receive_ready()
        assert await stream.receive() == b"three"
        assert not stream.receive_ready()

        os.write(feed, b"a\n" + b"x" * 200 + b"\nb\nc\n")
        assert await stream.receive() == b"a"
        assert stream.receive_burst(below=100) == []  # a marker of one too large among them
        assert [await stream.receive() for _ in range(3)][1:] == [b"b", b"c"]

        os.write(feed, b"d\n" + b"y" * 50 + b"\ne\n")
        assert await stream.receive() == b"d"
        assert stream.receive_burst(below=50) == []  # one as long as ``below``
        assert stream.receive_burst(below=51) == [b"y" * 50, b"e"]

        stream.send_run([b"p", b"q"])
        stream.send_run([b"r", b'{"s":\n1}'])
        await stream.drain()
        assert os.read(sink, 100) == b'p\nq\nr\n{"s": 1}\n'
    finally:
        stream.close()
        os.close(feed)
        os.close(sink)


async def test_a_line_sent_before_a_promised_flush_waits_for_that_flush() -> None:
    """``will_flush`` (the link relaying in a read's callback): what is sent is gathered and no
    write is scheduled, so a turn of the loop writes nothing; the flush writes it. Without the
    promise, the end of the loop's turn writes what was sent."""
    stream, feed, sink, _ = await _line_stream(limit=100)
    try:
        stream.will_flush()
        stream.send(b"held")
        await asyncio.sleep(0)  # one turn of the loop: a write scheduled would have run in it
        os.set_blocking(sink, False)
        with pytest.raises(BlockingIOError):
            os.read(sink, 100)
        assert stream.buffered() == len(b"held\n")
        stream.flush()
        assert os.read(sink, 100) == b"held\n"
        stream.send(b"later")
        os.set_blocking(sink, True)
        assert await asyncio.to_thread(_read_exactly, sink, len(b"later\n")) == b"later\n"
    finally:
        stream.close()
        os.close(feed)
        os.close(sink)


@pytest.mark.parametrize("size", [10, 1024, 1025, 70_000])
@pytest.mark.parametrize("lines", [0, 1, IN_PLACE_LINES, IN_PLACE_LINES + 1, 100])
def test_a_read_is_a_stream_past_its_lines(size: int, lines: int) -> None:
    """A read of more than ``IN_PLACE_LINES`` lines is a stream's, counted at once in a short
    read or looked for line by line in a long one: the same verdict either way."""
    data = b"\n" * lines + b"x" * max(size - lines, 0)
    assert _lines_over(data, IN_PLACE_LINES) is (lines > IN_PLACE_LINES)
