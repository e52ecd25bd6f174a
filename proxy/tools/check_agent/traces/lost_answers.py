"""The retries of a prompt whose answer was lost: they get the original ``messageId`` and insert
nothing more.

T1 on the same connection; T2 after reconnecting and ``session/resume`` (the proxy keeps the
Agent for the next connection: conductor mode); T3 after the Agent was killed and restarted
(needs an Agent that stores its sessions); T7 a prompt inserted during active work.
"""

from __future__ import annotations

from proxy.core import acp
from proxy.tools.check_agent.conversation import answers, message_id, prompt_params
from proxy.tools.check_agent.lab import Lab
from proxy.tools.check_agent.steps import LOSE_PROMPT_ANSWER, lost, one_insert, open_session, resume
from proxy.tools.verdicts import Fail

__all__ = ["t1", "t2", "t3", "t7"]


async def t1(lab: Lab) -> str:
    await lab.start([LOSE_PROMPT_ANSWER])
    conversation = await lab.connect()
    session = await open_session(lab, conversation)
    key = lab.key("K1")
    first_id = conversation.submit(acp.PROMPT, prompt_params(session, "A", key))
    await lost(lab, conversation, first_id)
    retry = await conversation.request(acp.PROMPT, prompt_params(session, "A", key))
    inserted = message_id(retry, "the retry")
    one_insert(conversation, session, "A", inserted)
    return f"the retry got the original messageId {inserted}"


async def t2(lab: Lab) -> str:
    sever = {
        "name": "lose-and-sever",
        "when": {"direction": "to_client", "kind": "response", "method": acp.PROMPT},
        "schedule": {"nth": [1]},
        "do": {"action": "sever", "side": "client", "moment": "before"},
    }
    await lab.start([sever], network=True)
    conversation = await lab.connect()
    session = await open_session(lab, conversation)
    key = lab.key("K2")
    first_id = conversation.submit(acp.PROMPT, prompt_params(session, "B", key))
    await conversation.until(lambda m: answers(m, first_id))
    inserted = conversation.user_messages(session, "B")
    lab.disconnect(conversation)
    again = await lab.connect()
    await resume(lab, again, session)
    retry = await again.request(acp.PROMPT, prompt_params(session, "B", key))
    retried = message_id(retry, "the retry after resume")
    replayed = again.user_messages(session, "B")
    if len(replayed) > 1:
        raise Fail(f"{len(replayed)} copies of the submission in the session: {replayed}")
    if inserted and retried != inserted[0]:
        raise Fail(f"the retry got {retried}, the first attempt inserted {inserted[0]}")
    return f"after reconnecting and resuming, the retry got {retried}"


async def t3(lab: Lab) -> str:
    # The Agent answered (so it inserted, and stored, the message): the answer is lost and the
    # Agent killed at that moment; the proxy starts a new one on the same connection.
    answered = {"direction": "to_client", "kind": "response", "method": acp.PROMPT}
    lose = {"name": "lose", "when": answered, "schedule": {"nth": [1]}, "do": {"action": "drop"}}
    kill = {
        "name": "kill-agent",
        "when": answered,
        "schedule": {"nth": [1]},
        "do": {"action": "kill_agent", "respawn": True},
    }
    await lab.start([{**lose, "continue": True}, kill])
    conversation = await lab.connect()
    session = await open_session(lab, conversation)
    key = lab.key("K3")
    first_id = conversation.submit(acp.PROMPT, prompt_params(session, "C", key))
    await lost(lab, conversation, first_id)
    inserted = conversation.user_messages(session, "C")
    if conversation.closed or lab.transport == "http":
        # Over Streamable HTTP every initialize opens a new connection: reconnect for it.
        conversation = await lab.connect()
    await resume(lab, conversation, session)
    replayed_before = conversation.user_messages(session, "C")
    retry = await conversation.request(acp.PROMPT, prompt_params(session, "C", key))
    retried = message_id(retry, "the retry after the restart")
    everything = sorted(set(inserted) | set(replayed_before) | {retried})
    if replayed_before and retried not in replayed_before:
        raise Fail(f"history holds {replayed_before} but the retry inserted {retried}")
    if len(set(replayed_before)) > 1:
        raise Fail(f"history holds {len(replayed_before)} copies of the submission")
    return f"after the Agent restarted, one copy of the submission: {everything[-1]}"


async def t7(lab: Lab) -> str:
    lose_second = {**LOSE_PROMPT_ANSWER, "schedule": {"nth": [2]}}
    await lab.start([lose_second])
    conversation = await lab.connect()
    session = await open_session(lab, conversation)
    await conversation.request(acp.PROMPT, prompt_params(session, "work", lab.key("K0")))
    key = lab.key("K7")
    text = "steer: use staging"
    steer = conversation.submit(acp.PROMPT, prompt_params(session, text, key))
    await lost(lab, conversation, steer)
    retry = await conversation.request(acp.PROMPT, prompt_params(session, text, key))
    inserted = message_id(retry, "the retry")
    one_insert(conversation, session, text, inserted)
    return f"the retry of a prompt sent during active work got {inserted}"
