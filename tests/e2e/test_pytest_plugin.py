"""The pytest plugin (``proxy.pytest_plugin``), used the way a user uses it in their own tests.

Each test writes a small user test file and runs it with pytest in a subprocess (``pytester``): the
plugin must be found through its ``pytest11`` entry point, the user overrides ``acp_proxy_agent``
(and ``acp_proxy_options``), and the inner run's outcome is what is checked. The inner runs use
``asyncio_mode = auto`` and turn every warning into an error, as this project's own suite does.
"""

from __future__ import annotations

import pytest
from harness import PEERS

pytest_plugins = ["pytester"]

SDK_AGENT = PEERS / "sdk_agent.py"
INNER_INI = """\
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings = error
timeout = 120
"""

USER_TESTS = """\
import asyncio
import os
import sys

import pytest
from acp import PROTOCOL_VERSION, Client, connect_to_agent
from acp.schema import AgentMessageChunk, TextContentBlock
from acp.ws import create_websocket_stream

TIMEOUT = 30


@pytest.fixture
def acp_proxy_agent():
    return [sys.executable, {agent!r}]


class Recorder:
    def __init__(self):
        self.texts = []

    async def session_update(self, session_id, update, **kwargs):
        if isinstance(update, AgentMessageChunk):
            self.texts.append(update.content.text)

    async def request_permission(self, *args, **kwargs):
        raise NotImplementedError

    async def ext_method(self, method, params):
        return {{}}

    async def ext_notification(self, method, params):
        return None


async def new_session(conn):
    await conn.initialize(protocol_version=PROTOCOL_VERSION)
    return (await conn.new_session(cwd=os.getcwd(), mcp_servers=[])).session_id


async def test_a_lost_prompt_answer_leaves_the_prompt_waiting(acp_proxy):
    assert acp_proxy.url.startswith("ws://127.0.0.1:")
    client = Recorder()
    conn = connect_to_agent(client, await create_websocket_stream(acp_proxy.url))
    try:
        async with asyncio.timeout(TIMEOUT):
            session = await new_session(conn)
            lose = {{"direction": "to_client", "kind": "response", "method": "session/prompt"}}
            with acp_proxy.control.events() as events, acp_proxy.fault(do="drop", when=lose) as rule:
                assert [r["name"] for r in acp_proxy.control.rules()] == [rule]
                lost = asyncio.create_task(
                    conn.prompt(session_id=session, prompt=[TextContentBlock(text="echo one")])
                )
                fault = await asyncio.to_thread(events.until, "fault", rule=rule)
            assert (fault["action"], fault["method"]) == ("drop", "session/prompt")
            assert acp_proxy.control.rules() == []
            answer = await conn.prompt(session_id=session, prompt=[TextContentBlock(text="echo two")])
            assert answer.stop_reason == "end_turn"
            assert client.texts == ["one", "two"]  # the Agent ran the first prompt too
            assert not lost.done()  # its answer was dropped: it never comes
            assert acp_proxy.control.metric(
                "acp_proxy_faults_injected_total", rule=rule, action="drop"
            ) == 1
            lost.cancel()
    finally:
        await conn.close()


async def test_a_held_prompt_is_edited_before_the_agent_runs_it(acp_proxy):
    client = Recorder()
    conn = connect_to_agent(client, await create_websocket_stream(acp_proxy.url))
    try:
        async with asyncio.timeout(TIMEOUT):
            session = await new_session(conn)
            pause = {{"direction": "to_agent", "method": "session/prompt"}}
            with acp_proxy.fault(do="hold", when=pause):
                prompt = asyncio.create_task(
                    conn.prompt(session_id=session, prompt=[TextContentBlock(text="echo one")])
                )
                held = await asyncio.to_thread(acp_proxy.wait_held, method="session/prompt")
                assert [m["id"] for m in acp_proxy.held()] == [held["id"]]
                body = held["body"]
                body["params"]["prompt"][0]["text"] = "echo edited"
                await asyncio.to_thread(acp_proxy.edit_held, held["id"], body)
                assert (await prompt).stop_reason == "end_turn"
            assert client.texts == ["edited"]
            assert acp_proxy.held() == []
    finally:
        await conn.close()


def test_a_fault_block_is_undone_even_when_it_raises(acp_proxy):
    with pytest.raises(RuntimeError), acp_proxy.fault(name="temporary", do={{"action": "delay", "ms": 5}}):
        assert acp_proxy.control.rules() == [{{"name": "temporary", "do": {{"action": "delay", "ms": 5.0}}}}]
        raise RuntimeError("the block failed")
    assert acp_proxy.control.rules() == []


def test_a_reset_inside_a_fault_block_is_fine(acp_proxy):
    with acp_proxy.fault(do="drop") as name:
        assert name.startswith("fault-")
        acp_proxy.control.reset()
    assert acp_proxy.control.rules() == []
"""

OPTIONS_TESTS = """\
import sys

import pytest


@pytest.fixture
def acp_proxy_agent():
    return [sys.executable, {agent!r}]


@pytest.fixture
def acp_proxy_options(tmp_path):
    faults = tmp_path / "faults.yaml"
    faults.write_text(
        "version: 1\\n"
        "rules:\\n"
        "  - name: slow-prompts\\n"
        "    when: {{method: session/prompt}}\\n"
        "    do: {{action: delay, ms: 100}}\\n"
    )
    return {{"listen": "http", "faults": [faults], "admin_token": "s3cret"}}


def test_options_reach_the_proxy(acp_proxy):
    assert acp_proxy.url.startswith("http://127.0.0.1:")
    assert acp_proxy.admin_url.startswith("http://127.0.0.1:")
    assert acp_proxy.control.token == "s3cret"
    assert [rule["name"] for rule in acp_proxy.control.rules()] == ["slow-prompts"]
    assert acp_proxy.control.health()["links"] == 0
"""

FORGOTTEN_AGENT = """\
def test_forgot_the_agent(acp_proxy):
    pass
"""


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    """A directory for a user's test run, configured like a careful user's project."""
    pytester.makeini(INNER_INI)
    return pytester


def test_fixture_proxies_an_sdk_session_and_applies_a_fault_for_one_block(
    inner: pytest.Pytester,
) -> None:
    """acp_proxy before the SDK Agent: a prompt answer lost in a fault block, a prompt held and
    edited through the fixture's own calls; blocks undo rules."""
    inner.makepyfile(test_user=USER_TESTS.format(agent=str(SDK_AGENT)))
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)


def test_options_fixture_sets_listener_fault_files_and_token(inner: pytest.Pytester) -> None:
    """acp_proxy_options: an http listener, a fault file's rules and the token reach the proxy."""
    inner.makepyfile(test_options=OPTIONS_TESTS.format(agent=str(SDK_AGENT)))
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_without_an_agent_the_fixture_says_what_to_override(inner: pytest.Pytester) -> None:
    """A user who did not override acp_proxy_agent gets a setup error naming the fixture."""
    inner.makepyfile(test_forgot=FORGOTTEN_AGENT)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*override the acp_proxy_agent fixture*"])


def test_the_plugin_can_be_disabled(inner: pytest.Pytester) -> None:
    """-p no:acp_proxy removes the fixtures: the plugin is the entry point's, nothing else."""
    inner.makepyfile(test_forgot=FORGOTTEN_AGENT)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:acp_proxy")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'acp_proxy' not found*"])
