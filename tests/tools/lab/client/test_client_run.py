"""One run of the reference Client (``proxy.tools.lab.client.run``): straight to the Agent, every
prompt its own key, one attempt each, and the final replay as the history."""

from __future__ import annotations

import pytest
from client_lab import AGENT, TEXTS, check_inserted_once, live_ids, outcomes, run

from proxy.tools.lab.client import render

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
