"""What one peer can make the proxy hold, end to end through a real proxy: pending requests per
link (``--max-pending``), bytes in flight across the proxy (``--max-inflight-bytes``), and the
last message of an idle link, released once relayed."""

from __future__ import annotations

import json
from pathlib import Path

from harness import ProxyProcess, captured, log_events, raw_agent

TOO_MANY_PENDING = "too many pending requests; refusing more with an error until some are answered"


async def test_requests_past_max_pending_are_answered_an_error_and_the_link_goes_on(
    tmp_path: Path,
) -> None:
    """An Agent that never answers prompts: the Client's fourth and fifth prompts are answered
    -32603 by the proxy and never reach the Agent (logged once, traced); notifications and
    other requests that fit still pass once an answer makes room."""
    capture = tmp_path / "agent-saw.jsonl"
    trace = tmp_path / "trace.jsonl"
    agent = raw_agent(capture, "--no-answer", "session/prompt")
    options = ("--log-format", "json", "--max-pending", "3", "--trace", str(trace))
    proxy = await ProxyProcess.start(agent, *options)
    try:
        for n in range(5):
            await proxy.send_json(
                {"jsonrpc": "2.0", "id": f"p{n}", "method": "session/prompt", "params": {}}
            )
        for n in (3, 4):
            error = await proxy.recv_json()
            assert error["id"] == f"p{n}"
            assert error["error"]["code"] == -32603
            assert "--max-pending" in error["error"]["message"]
        await proxy.send_json({"jsonrpc": "2.0", "method": "session/cancel", "params": {}})
        await proxy.send_json({"jsonrpc": "2.0", "id": "x", "method": "_test/other"})
        refused = await proxy.recv_json()
        assert (refused["id"], refused["error"]["code"]) == ("x", -32603)
        await proxy.close_stdin()
        assert await proxy.wait() == 0
    finally:
        await proxy.stop()
    methods = [json.loads(line).get("method") for line in captured(capture)]
    assert methods == ["session/prompt"] * 3 + ["session/cancel"]
    [logged] = log_events(proxy.stderr, TOO_MANY_PENDING)
    assert (logged["direction"], logged["limit"]) == ("to_agent", 3)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    refusals = [r for r in records if r.get("disposition") == "too_many_pending"]
    assert [r["id"] for r in refusals] == ["p3", "p4", "x"]
    assert {r["limit"] for r in refusals} == {3}
