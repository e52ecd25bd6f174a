"""A key whose prompt is held, withdrawn or refused.

T4 a retry of a held prompt is answered with it; ``$/cancel_request`` of one request of a held
key answers both ``-32800``. T5 after an error the key is unused: the resend is a new submission.
"""

from __future__ import annotations

import functools

from proxy.core import acp
from proxy.tools.check_agent.conversation import answers, error_code, message_id, prompt_params
from proxy.tools.check_agent.lab import Lab
from proxy.tools.check_agent.steps import one_insert, open_session
from proxy.tools.verdicts import Fail, Skip

__all__ = ["t4", "t5"]


async def t4(lab: Lab) -> str:
    await lab.start([])
    conversation = await lab.connect()
    session = await open_session(lab, conversation)
    await conversation.request(acp.PROMPT, prompt_params(session, "long task", lab.key("K0")))
    key = lab.key("K4")
    first = conversation.submit(acp.PROMPT, prompt_params(session, "D", key))
    second = conversation.submit(acp.PROMPT, prompt_params(session, "D", key))
    answered = [
        await conversation.until(functools.partial(answers, request_id=i)) for i in (first, second)
    ]
    if any(answer is None for answer in answered):
        raise Fail("a request for the held prompt was never answered")
    ids = {message_id(answer, "a held prompt") for answer in answered if answer is not None}
    if len(ids) != 1:
        raise Fail(f"the two requests with one key got different messageIds: {sorted(ids)}")
    one_insert(conversation, session, "D", ids.pop())
    # variant a: $/cancel_request of one request of a held key answers both -32800
    await conversation.request(acp.PROMPT, prompt_params(session, "long task 2", lab.key("K0b")))
    key = lab.key("K4a")
    third = conversation.submit(acp.PROMPT, prompt_params(session, "D2", key))
    fourth = conversation.submit(acp.PROMPT, prompt_params(session, "D2", key))
    conversation.notify(acp.CANCEL_REQUEST, {"requestId": third})
    outcomes = []
    for request_id in (third, fourth):
        answer = await conversation.until(functools.partial(answers, request_id=request_id))
        if answer is None:
            raise Fail("a cancelled held request was never answered")
        outcomes.append(error_code(answer) if "error" in answer else "success")
    if outcomes == ["success", "success"]:
        return "retries of a held prompt share its answer (the second prompt was not held)"
    if outcomes != [-32800, -32800]:
        raise Fail(f"after $/cancel_request the key's requests got {outcomes}, not -32800 both")
    if conversation.user_messages(session, "D2"):
        raise Fail("the withdrawn prompt was inserted")
    return "held prompt retries share one answer; a cancel withdraws them all with -32800"


async def t5(lab: Lab) -> str:
    await lab.start([])
    conversation = await lab.connect()
    session = await open_session(lab, conversation)
    await conversation.request(acp.PROMPT, prompt_params(session, "long task", lab.key("K0")))
    key = lab.key("K5")
    held = conversation.submit(acp.PROMPT, prompt_params(session, "E", key))
    conversation.notify(acp.CANCEL_REQUEST, {"requestId": held})
    answer = await conversation.until(lambda m: answers(m, held))
    if answer is None or "error" not in answer:
        raise Skip("could not make the Agent answer a keyed prompt with an error (not held)")
    retry = await conversation.request(acp.PROMPT, prompt_params(session, "E", key))
    resent = message_id(retry, "the resend after an error")
    await conversation.until(lambda m: resent in conversation.user_messages(session, "E"))
    if resent not in conversation.user_messages(session, "E"):
        raise Fail("the resend after an error was not inserted as a fresh submission")
    return "after an error the key was unused: the resend inserted a new message"
