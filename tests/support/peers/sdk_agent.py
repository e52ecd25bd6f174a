"""An ACP Agent built on the official Python SDK, scripted by its prompt text; run as a script.

``python tests/support/peers/sdk_agent.py [--preamble] [--exit-status N]``

Sessions: ``session/new`` starts one with an empty history; every chunk a prompt says joins it.
``session/load`` of a known session says each chunk of its history again, then answers ``{}``;
``session/resume`` of a known session says one chunk ``resumed``, then answers ``{}`` (an
unknown session: -32002). Served over HTTP (``sdk_http_agent.py``) the sessions are shared by
every connection of the process, so a session made on one connection can be loaded on another.

Prompt text (the first text block):

- ``echo TEXT``: one agent message chunk ``TEXT``, then ``end_turn``.
- ``permission``: asks the Client (``session/request_permission``, options ``allow`` and
  ``reject``), then a chunk ``permission: selected OPTION_ID`` or ``permission: cancelled``.
- ``wait``: a chunk ``waiting``, then blocks until the request is cancelled; on cancellation a
  chunk ``cancelled {"id": OWN_ID, "cancel_request_ids": [...]}`` (the JSON-RPC id this Agent
  received the prompt under, and every ``$/cancel_request.params.requestId`` it has seen), after
  which the SDK answers the prompt with -32800.
- ``big N``: one chunk of ``N`` characters (see :func:`big_text`).
- anything else: a chunk ``len=N sha256=HEX`` for the received text (large prompts are checked
  without echoing them).

The extension request ``_sdk_agent/state`` returns the Agent's own record of what reached it:
this process's ``pid``, the ids of the responses it has received (``response_ids``), every
request received as ``[id, method]`` (``requests``, in arrival order, this one included) and every
``session/prompt`` as ``{"id", "text", "idempotencyKey"}`` (``prompts``, text of the first text
block). With ``--preamble`` the Agent first writes one raw request with the string id
``"agent-preamble"`` (method ``_sdk_agent/hello``) to stdout, so that the ids the SDK allocates
afterwards differ from the ones the proxy mints toward the Client. ``--exit-status``
sets the exit status once the Client has gone (stdin closed). Logs go to stderr only.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import sys
from typing import Any, cast
from uuid import uuid4

from acp import PROTOCOL_VERSION, Agent, RequestError, run_agent
from acp.connection import StreamDirection, StreamEvent
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AgentMessageChunk,
    AllowedOutcome,
    ClientCapabilities,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ResumeSessionResponse,
    TextContentBlock,
    ToolCallUpdate,
)

from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES

PREAMBLE_ID = "agent-preamble"


def big_text(size: int) -> str:
    """``size`` characters of a fixed pattern, the same in the Agent and in the tests."""
    pattern = "0123456789abcdefghijklmnopqrstuvwxyz\u00e9\u4e2d"
    return (pattern * (size // len(pattern) + 1))[:size]


def digest(text: str) -> str:
    """What the Agent reports for a prompt it does not otherwise understand."""
    return f"len={len(text)} sha256={hashlib.sha256(text.encode()).hexdigest()}"


class ScriptedAgent:
    """The Agent side: each prompt does what its text says (see the module docstring)."""

    def __init__(self) -> None:
        self._conn: Client | None = None
        self._prompt_ids: dict[str, Any] = {}
        """The JSON-RPC id of the latest ``session/prompt`` received, per session."""
        self._cancel_request_ids: list[Any] = []
        self._response_ids: list[Any] = []
        self._requests: list[list[Any]] = []
        self._prompts: list[dict[str, Any]] = []
        self._histories: dict[str, list[str]] = {}
        """The chunks said in each session, by session id."""

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    def observe(self, event: StreamEvent) -> None:
        """Record the ids on the wire: the SDK calls this before it handles a message."""
        if event.direction is not StreamDirection.INCOMING:
            return
        message = event.message
        method = message.get("method")
        params = message.get("params")
        if method is not None and "id" in message:
            self._requests.append([message["id"], method])
        if method == "session/prompt" and isinstance(params, dict):
            self._prompt_ids[str(params.get("sessionId"))] = message.get("id")
            self._prompts.append(
                {
                    "id": message.get("id"),
                    "text": _first_text(params.get("prompt")),
                    "idempotencyKey": params.get("idempotencyKey"),
                }
            )
        elif method == "$/cancel_request" and isinstance(params, dict):
            self._cancel_request_ids.append(params.get("requestId"))
        elif method is None and "id" in message:
            self._response_ids.append(message["id"])

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(load_session=True),
            agent_info=Implementation(name="sdk-agent", version="1"),
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        session_id = f"sess-{uuid4().hex}"
        self._histories[session_id] = []
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        for text in self._history(session_id):
            await self._send_chunk(session_id, text)
        return LoadSessionResponse()

    async def resume_session(
        self, session_id: str, cwd: str, **kwargs: Any
    ) -> ResumeSessionResponse:
        self._history(session_id)
        await self._send_chunk(session_id, "resumed")
        return ResumeSessionResponse()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        text = "".join(block.text for block in prompt if isinstance(block, TextContentBlock))
        logging.info("prompt of %d characters in session %s", len(text), session_id)
        if text.startswith("echo "):
            await self._say(session_id, text.removeprefix("echo "))
        elif text == "permission":
            await self._say(session_id, await self._ask_permission(session_id))
        elif text == "wait":
            await self._wait(session_id)
        elif text.startswith("big "):
            await self._say(session_id, big_text(int(text.removeprefix("big "))))
        else:
            await self._say(session_id, digest(text))
        return PromptResponse(stop_reason="end_turn")

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "sdk_agent/state":
            return {
                "pid": os.getpid(),
                "response_ids": list(self._response_ids),
                "requests": [list(request) for request in self._requests],
                "prompts": [dict(prompt) for prompt in self._prompts],
            }
        return {"method": method, "params": params}

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        logging.info("extension notification %s", method)

    def _history(self, session_id: str) -> list[str]:
        """The session's history; -32002 for a session this process never made."""
        history = self._histories.get(session_id)
        if history is None:
            raise RequestError.resource_not_found(session_id)
        return history

    async def _say(self, session_id: str, text: str) -> None:
        """A chunk that joins the session's history (a session made elsewhere: none kept)."""
        if (history := self._histories.get(session_id)) is not None:
            history.append(text)
        await self._send_chunk(session_id, text)

    async def _send_chunk(self, session_id: str, text: str) -> None:
        assert self._conn is not None
        chunk = AgentMessageChunk(content=TextContentBlock(text=text))
        await self._conn.session_update(session_id=session_id, update=chunk)

    async def _ask_permission(self, session_id: str) -> str:
        assert self._conn is not None
        response = await self._conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id="call-1", title="touch a file", status="pending"),
            options=[
                PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
            ],
        )
        outcome = response.outcome
        if isinstance(outcome, AllowedOutcome):
            return f"permission: selected {outcome.option_id}"
        return "permission: cancelled"

    async def _wait(self, session_id: str) -> None:
        own_id = self._prompt_ids.get(session_id)
        await self._say(session_id, "waiting")
        try:
            await asyncio.get_running_loop().create_future()  # never resolved
        except asyncio.CancelledError:
            report = {"id": own_id, "cancel_request_ids": list(self._cancel_request_ids)}
            logging.info("prompt cancelled: %s", report)
            await self._say(session_id, "cancelled " + json.dumps(report))
            raise


def _first_text(blocks: Any) -> str | None:
    """The text of the first text block of a raw ``prompt`` list, if any."""
    if isinstance(blocks, list):
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "text":
                return str(block.get("text"))
    return None


def write_preamble() -> None:
    """Write one raw request to stdout before the SDK owns it."""
    request = {"jsonrpc": "2.0", "id": PREAMBLE_ID, "method": "_sdk_agent/hello", "params": {}}
    os.write(sys.stdout.fileno(), json.dumps(request).encode() + b"\n")


async def main() -> None:
    """Serve one Client on stdin/stdout until stdin closes."""
    agent = ScriptedAgent()
    await run_agent(
        cast(Agent, agent),
        stdio_buffer_limit_bytes=DEFAULT_MAX_MESSAGE_BYTES,  # any message the proxy passes
        observers=[agent.observe],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preamble", action="store_true", help="send a raw request first")
    parser.add_argument("--exit-status", type=int, default=0, help="exit status at the end")
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="sdk_agent: %(message)s")
    if args.preamble:
        write_preamble()
    asyncio.run(main())
    sys.exit(args.exit_status)
