"""T6: a key is scoped to its session: the same key in another session is a new submission."""

from __future__ import annotations

from proxy.core import acp
from proxy.tools.check_agent.conversation import message_id, prompt_params
from proxy.tools.check_agent.lab import Lab
from proxy.tools.check_agent.steps import new_session, open_session
from proxy.tools.verdicts import Fail

__all__ = ["t6"]


async def t6(lab: Lab) -> str:
    await lab.start([])
    conversation = await lab.connect()
    first = await open_session(lab, conversation)
    second = await new_session(conversation)
    key = lab.key("K6")
    one = message_id(await conversation.request(acp.PROMPT, prompt_params(first, "F", key)), "S1")
    other = message_id(
        await conversation.request(acp.PROMPT, prompt_params(second, "G", key)), "S2"
    )
    if one == other:
        raise Fail("the same key in another session was answered as a retry")
    return "the same key in two sessions: two messages"
