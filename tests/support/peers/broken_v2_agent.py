"""A v2 Agent over stdio that breaks the RFD in one chosen way, for ``check-agent``'s own tests.

``python broken_v2_agent.py MODE [START_DELAY]``: it claims protocol version 2 with
``capabilities.session``, opens sessions, and answers ``session/prompt`` by MODE:

- ``ids``: a fresh ``messageId`` (and its ``user_message`` update) for every request: it ignores
  ``idempotencyKey`` altogether, but each answer has the right shape;
- ``error``: every prompt is answered with the error ``-32603``;
- ``string-error``: every prompt is answered with ``"error": "nope"`` (not an object);
- ``echo-key``: as ``ids``, with the request's key as the ``messageId``;
- ``init-refuse``: ``initialize`` is answered ``-32602`` (a version it does not take);
- ``init-crash``: ``initialize`` is answered ``-32603`` (the Agent failing as it starts);
- ``echo-version``: ``initialize`` is answered ``{"protocolVersion": 2}`` alone, as a v1 Agent
  that echoes the Client's version does (the official Python SDK's examples).

START_DELAY (seconds) is how long it takes to start before it reads anything: a slow Agent.
Other requests get ``-32601``.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

INIT_ERRORS = {
    "init-refuse": {"code": -32602, "message": "unsupported protocol version"},
    "init-crash": {"code": -32603, "message": "boom"},
}


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def prompt(mode: str, request_id: Any, params: dict[str, Any]) -> None:
    if mode == "error":
        send({"id": request_id, "error": {"code": -32603, "message": "internal error"}})
        return
    if mode == "string-error":
        send({"id": request_id, "error": "nope"})
        return
    key = params.get("idempotencyKey")
    message_id = str(key) if mode == "echo-key" else f"msg_{uuid.uuid4().hex}"
    update = {
        "sessionUpdate": "user_message",
        "messageId": message_id,
        "content": params.get("prompt"),
    }
    send(
        {
            "method": "session/update",
            "params": {"sessionId": params.get("sessionId"), "update": update},
        }
    )
    send({"id": request_id, "result": {"messageId": message_id}})


def main() -> None:
    mode = sys.argv[1]
    if len(sys.argv) > 2:
        time.sleep(float(sys.argv[2]))  # a slow start: nothing is read before it is over
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or "id" not in message or "method" not in message:
            continue
        method, request_id, params = message["method"], message["id"], message.get("params") or {}
        if method == "initialize" and mode in INIT_ERRORS:
            send({"id": request_id, "error": INIT_ERRORS[mode]})
        elif method == "initialize" and mode == "echo-version":
            send({"id": request_id, "result": {"protocolVersion": 2}})
        elif method == "initialize":
            result = {"protocolVersion": 2, "capabilities": {"session": {}}}
            send({"id": request_id, "result": result})
        elif method == "session/new":
            send({"id": request_id, "result": {"sessionId": f"sess_{uuid.uuid4().hex}"}})
        elif method == "session/prompt":
            prompt(mode, request_id, params)
        else:
            send({"id": request_id, "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    main()
