"""One run of the reference Client (``proxy.tools.lab.client.run``): straight to the Agent, every
prompt its own key, one attempt each, and the final replay as the history."""

from __future__ import annotations

import pytest
from client_lab import AGENT, TEXTS, check_inserted_once, live_ids, outcomes, run

from proxy.tools.lab.client import Submission, render
from proxy.tools.lab.client.run import make_key

pytestmark = pytest.mark.slow


async def test_each_prompt_is_inserted_once_with_its_own_key() -> None:
    """Straight to the Agent: three prompts, three keys, one attempt each, no reconnect."""
    report = await run(agent_argv=(*AGENT, "--turn-ms", "1"), prompts=TEXTS)
    check_inserted_once(report)
    assert (report.transport, report.connections, report.reconnects, report.resyncs) == (
        "stdio",
        1,
        0,
        0,
    )
    for number, text in enumerate(TEXTS):
        assert outcomes(report, number) == [("answered", False, 1)]
        assert live_ids(report, text) == [report.submissions[number].message_id]
    [final] = report.resumes
    assert final.final
    assert final.user_message_ids == report.history
    assert report.user_message_ids() == report.history
    assert "OK: every submission confirmed" in render(report)


def test_keys_are_fresh_uuids_unless_told_to_misbehave() -> None:
    """A UUID4 per submission (the RFD); --no-key, --reuse-key and --key-from-text break it on
    purpose, for check-client's tests."""
    fresh = [make_key("fresh", "same", []) for _ in range(2)]
    assert fresh[0] != fresh[1]
    assert all(key is not None and len(key) == 36 for key in fresh)
    assert make_key("none", "same", []) is None
    first = Submission("one", "K-first")
    assert make_key("reuse", "two", [first]) == "K-first"
    assert make_key("from_text", "same", []) == make_key("from_text", "same", [first])
    assert make_key("from_text", "same", []) != make_key("from_text", "other", [])
