"""Large messages are parsed in worker processes, so that no message stalls the event loop.

With real worker processes: a large message comes back parsed as the relay needs it, a worker
that dies costs only its message, and a proxy answers its control API while a worker parses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from harness import TIMEOUT, ProxyProcess, captured, raw_agent
from prometheus_client.parser import text_string_to_metric_families

from proxy.core.jsonrpc import Invalid, InvalidReason, Message, parse
from proxy.shell.parsing import BY_FILE, Parser, _parse_file


def prompt(text: str) -> bytes:
    params = {"sessionId": "S", "idempotencyKey": "K", "prompt": [{"type": "text", "text": text}]}
    message = {"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": params}
    return json.dumps(message).encode()


def empties(count: int) -> bytes:
    """A request holding ``count`` empty arrays: the most costly shape to parse per byte."""
    head = b'{"jsonrpc":"2.0","id":7,"method":"_x/empties","params":['
    return head + b",".join([b"[]"] * count) + b"]}"


async def test_a_large_message_is_parsed_by_a_worker_and_a_small_one_in_place() -> None:
    parser = Parser(large=4096, always=4096)
    try:
        small = prompt("hello")
        assert await parser.parse(small) == parse(small)
        assert parser.offloaded == 0
        large = prompt("x" * 5000)
        parsed = await parser.parse(large)
        assert isinstance(parsed, Message)
        assert parsed.raw == large
        assert parsed.content_digest is not None
        assert replace(parsed, content_digest=None) == parse(large)
        assert (parser.offloaded, parser.parsing, parser.lost) == (1, 0, 0)
    finally:
        parser.close()


def test_a_message_between_the_bounds_goes_to_a_worker_by_its_count_of_values() -> None:
    """From ``large`` bytes a message is weighed: one of few values (a long text) is parsed in
    place, one of many (tiny containers, nested arrays, members) by a worker; from ``always``
    bytes every message is. The defaults: 64 KiB, 256 KiB and 4,096 values."""
    parser = Parser()
    assert not parser.is_large(prompt("x" * 60_000))  # under 64 KiB
    assert not parser.is_large(prompt("x" * 200_000))  # one long text
    assert not parser.is_large(prompt("a,[b],{c}\n" * 10_000))  # commas inside it are text
    assert parser.is_large(prompt("x" * 300_000))  # 256 KiB or more
    assert parser.is_large(empties(30_000))  # 90 KB of [],[],...
    deep = b'{"jsonrpc":"2.0","method":"m","params":' + b"[" * 40_000 + b"]" * 40_000 + b"}"
    assert parser.is_large(deep)  # 80 KB, no comma: its brackets count
    members = b'{"params":{' + b",".join(b'"k%d":1' % n for n in range(9000)) + b"}}"
    assert len(members) > 64 * 1024
    assert parser.is_large(members)
    assert not Parser(large=None).is_large(empties(200_000))
    parser.close()


async def test_a_worker_that_dies_costs_its_message_only() -> None:
    """The worker parsing a message is killed (as the out-of-memory killer would): the message
    is refused as too complex to relay, and the next one is parsed by a new worker."""
    parser = Parser(large=4096, workers=1, always=4096)
    try:
        parsing = asyncio.get_running_loop().create_task(parser.parse(empties(2_000_000)))
        await until(lambda: parser._pool is not None and bool(parser._pool._processes))
        pool = parser._pool
        assert pool is not None
        workers = list(pool._processes)
        assert len(workers) == 1
        os.kill(workers[0], signal.SIGKILL)
        lost = await parsing
        assert isinstance(lost, Invalid)
        assert lost.reason is InvalidReason.TOO_COMPLEX
        assert "lost" in lost.detail
        assert parser.lost == 1
        again = prompt("y" * 5000)
        assert isinstance(await parser.parse(again), Message)
        assert parser.offloaded == 2
    finally:
        parser.close()


def memory_files() -> list[str]:
    """This process's descriptors that are the parser's memory files."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed
            found.append(os.readlink(f"/proc/self/fd/{name}"))
    return [link for link in found if "acp-proxy-message" in link]


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition``, a loop iteration at a time: a thread or a worker process makes it
    true, and neither sets an event the test could wait on."""
    async with asyncio.timeout(TIMEOUT):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0)


@pytest.mark.skipif(not BY_FILE, reason="memory files are a Linux facility")
async def test_a_large_message_reaches_its_worker_in_a_memory_file_closed_after() -> None:
    """The message is not pickled (a copy that holds the interpreter): a thread writes it to a
    memory file, which the worker opens, and which is closed once the parse is back."""
    parser = Parser(large=4096, workers=1, always=4096)
    try:
        big = empties(2_000_000)
        parsed = await parser.parse(big)
        assert isinstance(parsed, Message)
        assert parsed.raw is big
        assert parser.by_file  # the worker opened the file: no copy was pickled
        await until(lambda: not memory_files())  # closed once the worker is done, in a thread
    finally:
        parser.close()


@pytest.mark.skipif(not BY_FILE, reason="memory files are a Linux facility")
async def test_a_hand_over_cancelled_while_its_file_is_written_closes_the_file() -> None:
    """A link that ends while its message is being written to a memory file (the thread cannot
    be stopped) leaves no descriptor behind once the thread is done."""
    parser = Parser(large=4096, workers=1, always=4096)
    try:
        parsing = asyncio.get_running_loop().create_task(parser.parse(empties(20_000_000)))
        await asyncio.sleep(0)  # the thread is writing the file
        parsing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await parsing
        await until(lambda: not memory_files())  # once the thread has written it
        assert parser.parsing == 0
    finally:
        parser.close()


@pytest.mark.skipif(not BY_FILE, reason="memory files are a Linux facility")
async def test_a_hand_over_cancelled_while_the_worker_parses_keeps_the_file_until_it_is_done() -> (
    None
):
    """The worker that has the call cannot be stopped, and opens the file by its number: closed
    at the cancel, that number could be another file's by then. It is closed once the worker is
    done."""
    parser = Parser(large=4096, workers=1, always=4096)
    try:
        parsing = asyncio.get_running_loop().create_task(parser.parse(empties(10_000_000)))
        await until(lambda: bool(memory_files()))  # written, and handed to the worker
        parsing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await parsing
        assert memory_files()  # the worker still parses it
        await until(lambda: not memory_files())
    finally:
        parser.close()


def test_a_worker_reads_only_the_memory_file_it_was_given(tmp_path: Path) -> None:
    """What the worker opens by number is checked before it is read: another file (the number
    reused) gives nothing, and a pipe does not block it."""
    right = tmp_path / "message"
    right.write_bytes(prompt("x"))
    status = os.stat(right)
    assert _parse_file(str(right), (status.st_dev, status.st_ino)) is not None
    other = tmp_path / "other"
    other.write_bytes(prompt("y"))
    assert _parse_file(str(other), (status.st_dev, status.st_ino)) is None
    read_end, write_end = os.pipe()
    try:
        assert _parse_file(f"/proc/self/fd/{read_end}", (status.st_dev, status.st_ino)) is None
    finally:
        os.close(read_end)
        os.close(write_end)


async def metrics(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


async def test_the_control_api_answers_while_a_worker_parses(tmp_path: Path) -> None:
    """A 24 MB message of millions of empty arrays (seconds of parsing, which once held the
    whole proxy): while a worker parses it, the control API answers, and the scrape that
    answered says the parse was running. Then the message reaches the Agent whole."""
    capture = tmp_path / "agent-saw.jsonl"
    proxy = await ProxyProcess.start(
        raw_agent(capture), "--log-format", "json", "--admin", "127.0.0.1:0"
    )
    try:
        url = (await proxy.logged("control API listening"))["url"]
        big = empties(8_000_000)
        sending = asyncio.get_running_loop().create_task(proxy.send(big))
        async with asyncio.timeout(TIMEOUT):
            while (found := await metrics(url)).get("acp_proxy_worker_parses_running", 0) < 1:
                assert found.get("acp_proxy_worker_parses_total", 0) == 0, "parsed already"
        await sending
        answer = await proxy.recv_json()  # the Agent answers with the size it read
        assert answer["result"] == {"method": "_x/empties", "size": len(big)}
        assert captured(capture) == [big.replace(b'"id":7', b'"id":0', 1)]  # ids are hop by hop
        assert (await metrics(url))["acp_proxy_worker_parses_total"] == 1
    finally:
        await proxy.stop()


UNGUARDED_SCRIPT = """
import asyncio, sys
from proxy.shell.parsing import BY_FILE, Parser
with open(sys.argv[1], "a") as runs:
    runs.write("run\\n")
sys.setswitchinterval(1e-6)  # threads switch often: a worker may start on any call
async def main():
    parser = Parser(large=1024, always=1024)
    for _ in range(5):
        parsed = await parser.parse(b'{"jsonrpc":"2.0","method":"m","params":"' + b"x" * 4096 + b'"}')
    parser.close()
    print(type(parsed).__name__, parser.lost)
asyncio.run(main())
"""


async def test_a_script_without_a_main_guard_is_not_run_again_by_the_workers(
    tmp_path: Path,
) -> None:
    """A program that uses the proxy from a script's top level, without the
    ``if __name__ == "__main__":`` guard multiprocessing asks for: its workers do not run the
    script again (each run would start another proxy)."""
    script = tmp_path / "harness.py"
    script.write_text(UNGUARDED_SCRIPT)
    runs = tmp_path / "runs.txt"
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(runs), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 0
    assert out.decode().split() == ["Message", "0"]
    assert runs.read_text() == "run\n"
