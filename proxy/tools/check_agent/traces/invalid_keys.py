"""T0: invalid keys are rejected with ``-32602`` and insert nothing."""

from __future__ import annotations

import json

from proxy.core import acp
from proxy.tools.check_agent.conversation import error_code, prompt_params
from proxy.tools.check_agent.lab import Lab
from proxy.tools.check_agent.steps import open_session
from proxy.tools.verdicts import Fail

__all__ = ["t0"]

INVALID_KEYS = ["", "k" * 256, 42, True, {}, []]
"""Not a string of 1 to 255 characters: each must be refused, never taken for an omitted key."""


async def t0(lab: Lab) -> str:
    await lab.start([])
    conversation = await lab.connect()
    session = await open_session(lab, conversation)
    for key in INVALID_KEYS:
        answer = await conversation.request(acp.PROMPT, prompt_params(session, "T0", key))
        code = error_code(answer)
        if code != -32602:
            outcome = "a success" if "result" in answer else f"error {code}"
            raise Fail(f"idempotencyKey {json.dumps(key)[:20]} was answered with {outcome}")
    if conversation.user_messages(session, "T0"):
        raise Fail("a prompt with an invalid key was inserted")
    return "six invalid keys answered -32602, nothing inserted"
