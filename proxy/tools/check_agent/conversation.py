"""One Client connection through the proxy, every message kept as it comes, and what the traces
read in those messages (answers, user messages, error codes, message ids).

The connection is the tools' JSON-RPC client (:class:`proxy.tools.rpc.Peer`); requests of the
Agent are left unanswered, as an RFD trace expects none.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core import acp
from proxy.shell.endpoint import Endpoint
from proxy.shell.log import get_logger
from proxy.tools.rpc import Message, NoAnswer, Peer, Predicate
from proxy.tools.verdicts import Fail

__all__ = [
    "Conversation",
    "answers",
    "error_code",
    "error_message",
    "message_id",
    "prompt_params",
]

log = get_logger("proxy.check")


class Conversation:
    """One Client connection through the proxy, messages kept as they come."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        self.timeout = timeout
        self.seen: list[Message] = []
        self.peer = Peer(endpoint, on_message=self.seen.append, refuse_requests=False, log=log)

    @property
    def closed(self) -> bool:
        """The connection has ended."""
        return self.peer.ended

    def submit(self, method: str, params: dict[str, Any]) -> int:
        """Send a request without waiting for its answer (see :meth:`until`); its id."""
        request_id, _ = self.peer.request(method, params)
        return request_id

    def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send a notification."""
        self.peer.notify(method, params)

    async def until(self, predicate: Predicate, wait: float | None = None) -> Message | None:
        """The first message (already seen or new) that matches, or None after ``wait``."""
        for message in self.seen:
            if predicate(message):
                return message
        return await self.peer.until(predicate, self.timeout if wait is None else wait)

    async def request(
        self, method: str, params: dict[str, Any], wait: float | None = None
    ) -> Message:
        """Send a request and wait for its answer (``wait`` seconds, else the answer timeout)."""
        seconds = self.timeout if wait is None else wait
        try:
            return await self.peer.call(method, params, seconds)
        except NoAnswer as exc:
            if exc.ended:
                raise Fail(f"no answer to {method}: the connection closed", diagnose=True) from None
            option = "--answer-timeout" if wait is None else "--startup-timeout"
            raise Fail(
                f"no answer to {method} within {seconds:g} s ({option})", diagnose=True
            ) from None

    def user_messages(self, session: str, text: str | None = None) -> list[str]:
        """The distinct ids of the user messages of ``session`` seen (with ``text``, if given)."""
        found = []
        for message in self.seen:
            update = _update(message, session)
            if (
                update is not None
                and update.get("sessionUpdate") == "user_message"
                and (text is None or _text(update.get("content")) == text)
            ):
                found.append(str(update.get("messageId")))
        return list(dict.fromkeys(found))

    def mentions(self, keys: list[str]) -> list[str]:
        """Those of ``keys`` that appear anywhere in what was received."""
        text = orjson.dumps(self.seen).decode()
        return [key for key in keys if key in text]


def answers(message: Message, request_id: Any) -> bool:
    """``message`` is the answer to ``request_id``."""
    return message.get("id") == request_id and "method" not in message


def _update(message: Message, session: str) -> dict[str, Any] | None:
    params = message.get("params")
    if message.get("method") != acp.SESSION_UPDATE or not isinstance(params, dict):
        return None
    update = params.get("update")
    if params.get("sessionId") != session or not isinstance(update, dict):
        return None
    return update


def _text(content: Any) -> str | None:
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                return str(block["text"])
    return None


def prompt_params(session: str, text: str, key: Any = None) -> dict[str, Any]:
    """The params of a ``session/prompt`` of ``text`` (with ``key``, when not ``None``)."""
    params: dict[str, Any] = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
    if key is not None:
        params["idempotencyKey"] = key
    return params


def error_code(answer: Message) -> Any:
    """The code of an error answer (the ``error`` member itself when it is not an object)."""
    error = answer.get("error")
    return error.get("code") if isinstance(error, dict) else error


def error_message(answer: Message) -> str:
    """`` (the message)`` of an error answer, shortened, or nothing."""
    error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    return f" ({message[:200]})" if isinstance(message, str) and message else ""


def message_id(answer: Message, what: str) -> str:
    """The ``messageId`` of a prompt's success answer; :class:`Fail` naming ``what`` otherwise."""
    result = answer.get("result")
    if "error" in answer:
        raise Fail(f"{what} was answered with error {error_code(answer)}")
    if not isinstance(result, dict) or not isinstance(result.get("messageId"), str):
        raise Fail(f"{what}: the answer has no messageId (a v2 prompt response carries one)")
    return str(result["messageId"])
