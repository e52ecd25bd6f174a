"""The bench's blocking Client (``proxy.tools.bench.driver``) against the bench Agent and against
scripted targets that misbehave: every answer checked, every failure a ``BenchError`` that says
what the target did, never a hang."""

from __future__ import annotations

import sys

import pytest

from proxy.tools.bench.driver import BlockingPeer
from proxy.tools.bench.processes import BenchError

AGENT = [sys.executable, "-m", "proxy.tools.bench.agent"]


def script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_round_trips_and_streams_of_any_length_are_read_whole() -> None:
    """Pings, 64 KiB prompts and streams of 0, 1 and 5,000 notifications, one after another on
    one connection: each answer is its request's, and nothing is left over for the next."""
    peer = BlockingPeer(AGENT)
    try:
        assert peer.call("_bench/ping", {}) > 0
        for count in (0, 1, 5000, 3):
            received, seconds = peer.stream(count)
            assert (received, seconds > 0) == (count, True)
        assert peer.call("session/prompt", {"text": "x" * 65536}) > 0
        peer.send(b"".join(peer.request("_bench/ping", {"n": n})[1] for n in range(3)))
        for request_id in (7, 8, 9):  # pipelined: answered in order
            peer.answer(request_id)
    finally:
        peer.close()
    assert peer.process.returncode == 0


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (
            "import sys; sys.stdin.readline(); sys.stderr.write('agent broke\\n')",
            "the target closed its stdout; its stderr ends: agent broke",
        ),
        (
            'import sys; sys.stdin.readline(); print(\'{"jsonrpc":"2.0","id":7,"result":{}}\')',
            "expected the answer to 1",
        ),
        (
            'import sys; sys.stdin.readline(); print(\'{"jsonrpc":"2.0","id":1,"error":{}}\')',
            "request 1 failed",
        ),
    ],
    ids=["closed", "wrong id", "error"],
)
def test_a_target_that_misbehaves_is_a_bench_error(code: str, error: str) -> None:
    peer = BlockingPeer(script(code))
    try:
        with pytest.raises(BenchError, match=error.replace("(", r"\(")):
            peer.call("_bench/ping", {})
    finally:
        peer.close()


def test_a_stream_with_too_few_updates_is_a_bench_error() -> None:
    """The lines are counted as they come; what they are is checked once the answer is in."""
    code = (
        "import sys; sys.stdin.readline(); "
        'print(\'{"jsonrpc":"2.0","method":"other"}\'); '
        'print(\'{"jsonrpc":"2.0","id":1,"result":{}}\')'
    )
    peer = BlockingPeer(script(code))
    try:
        with pytest.raises(BenchError, match="asked for 1 notifications, got 0"):
            peer.stream(1)
    finally:
        peer.close()
