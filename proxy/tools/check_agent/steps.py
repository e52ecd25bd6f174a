"""The steps the traces share: opening a v2 session, resuming it, proving an answer lost, and
checking that a submission was inserted once; and the rule that loses a prompt's answer."""

from __future__ import annotations

import json
from textwrap import shorten
from typing import Any

from proxy.core import acp
from proxy.core.jsonrpc import ErrorCode
from proxy.tools.check_agent.conversation import Conversation, answers, error_code, error_message
from proxy.tools.check_agent.lab import Lab
from proxy.tools.verdicts import Fail, Skip

__all__ = ["LOSE_PROMPT_ANSWER", "lost", "new_session", "one_insert", "open_session", "resume"]

LOSE_PROMPT_ANSWER: dict[str, Any] = {
    "name": "lose-prompt-answer",
    "when": {"direction": "to_client", "kind": "response", "method": acp.PROMPT},
    "schedule": {"nth": [1]},
    "do": {"action": "drop"},
}
"""The proxy drops the answer to the first ``session/prompt``."""


async def open_session(lab: Lab, conversation: Conversation) -> str:
    """Initialize (a v2 Agent with ``capabilities.session``, else :class:`Skip`) and create a
    session; its id."""
    init = await conversation.request(
        acp.INITIALIZE,
        {"protocolVersion": 2, "capabilities": {}, "info": {"name": "check-agent", "version": "1"}},
        wait=max(lab.options.startup_timeout, lab.options.answer_timeout),
    )
    result = init.get("result")
    if "error" in init:
        code, message = error_code(init), error_message(init)
        if code == ErrorCode.INTERNAL_ERROR:  # the Agent failing, or the proxy giving up on it
            raise Fail(f"initialize was answered with error {code}{message}", diagnose=True)
        raise Skip(f"initialize was refused with error {code}{message}")
    if not isinstance(result, dict):
        raise Fail("initialize was answered without a result object")
    if result.get("protocolVersion") != 2:
        version = result.get("protocolVersion")
        raise Skip(f"the Agent speaks protocol version {version}, not 2", every_trace=True)
    if not isinstance(result.get("capabilities"), dict) or "session" not in result["capabilities"]:
        answer = shorten(json.dumps(result, separators=(",", ":")), 120)
        raise Skip(
            "the Agent does not advertise capabilities.session (v2's sessions; a v1 Agent "
            f"that echoes the protocol version does not): its initialize answer was {answer}",
            every_trace=True,
        )
    return await new_session(conversation)


async def new_session(conversation: Conversation) -> str:
    """``session/new``; the session's id."""
    answer = await conversation.request(acp.NEW_SESSION, {"cwd": "/", "mcpServers": []})
    result = answer.get("result")
    session = result.get("sessionId") if isinstance(result, dict) else None
    if not isinstance(session, str):
        raise Fail("session/new gave no sessionId")
    return session


async def resume(lab: Lab, conversation: Conversation, session: str) -> None:
    """Initialize again and resume ``session`` with a full replay (:class:`Skip` when the Agent
    does not keep it)."""
    startup = max(lab.options.startup_timeout, lab.options.answer_timeout)
    await conversation.request(acp.INITIALIZE, {"protocolVersion": 2, "capabilities": {}}, startup)
    answer = await conversation.request(
        acp.RESUME_SESSION, {"sessionId": session, "cwd": "/", "replayFrom": {"type": "start"}}
    )
    if "error" in answer:
        code = error_code(answer)
        if code == -32601:
            raise Fail("session/resume is not implemented (-32601), though capabilities.session is")
        raise Skip(f"session/resume failed ({code}): the Agent does not keep the session")


async def lost(lab: Lab, conversation: Conversation, request_id: int) -> None:
    """The answer to ``request_id`` must be lost (the trace's rule dropped it)."""
    answer = await conversation.until(lambda m: answers(m, request_id), lab.options.loss_wait)
    if answer is None:
        return
    if "error" in answer:  # the rule drops a success, the answer a prompt the Agent took gets
        raise Fail(f"the keyed prompt was answered with error {error_code(answer)}, no messageId")
    raise Fail("the proxy did not lose the first answer")


def one_insert(conversation: Conversation, session: str, text: str, message_id: str) -> None:
    """At most one user message with ``text``, and it is ``message_id``."""
    inserted = conversation.user_messages(session, text)
    if len(inserted) > 1:
        raise Fail(f"{len(inserted)} user messages for one submission: {inserted}")
    if inserted and inserted[0] != message_id:
        raise Fail(f"the retry got {message_id}, but the message inserted was {inserted[0]}")
