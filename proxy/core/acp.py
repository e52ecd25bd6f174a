"""The ACP methods the proxy knows by name, each spelled once (ACP v1 and the v2 draft).

The relay treats a few of them specially (:data:`INITIALIZE`, :data:`CANCEL_REQUEST`,
:data:`ELICITATION_CREATE`, :data:`SUCCESSORS`), the ledger and the report follow
:data:`PROMPT` and :data:`SESSION_UPDATE`, and :data:`METHODS` is the closed list that labels
metrics by name (:func:`method_label`: any other method is ``other``, so a label never holds what
a peer made up).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CANCEL_REQUEST",
    "CLOSE_SESSION",
    "ELICITATION_CREATE",
    "INITIALIZE",
    "METHODS",
    "NEW_SESSION",
    "PROMPT",
    "RESUME_SESSION",
    "SESSION_CANCEL",
    "SESSION_UPDATE",
    "SUCCESSORS",
    "method_label",
]

INITIALIZE: Final = "initialize"
"""The first request of a connection (conductor mode answers later Clients' from a cache)."""
NEW_SESSION: Final = "session/new"
"""The request that creates a session."""
RESUME_SESSION: Final = "session/resume"
"""The request that reattaches a session (v2: with ``replayFrom``, its history replayed)."""
CLOSE_SESSION: Final = "session/close"
"""The request that ends a session."""
PROMPT: Final = "session/prompt"
"""A prompt: the request that carries ``idempotencyKey`` (the RFD's subject)."""
SESSION_UPDATE: Final = "session/update"
"""The Agent's notification of a session's progress (a ``user_message`` insert among them)."""
SESSION_CANCEL: Final = "session/cancel"
"""The Client's notification that a session's turn is cancelled."""
CANCEL_REQUEST: Final = "$/cancel_request"
"""The notification that cancels one request by id (``params.requestId``)."""
ELICITATION_CREATE: Final = "elicitation/create"
"""The Agent's request for input from the user."""
SUCCESSORS: Final = frozenset({"proxy/successor", "_proxy/successor"})
"""The proxy chain's envelope: the message inside is for the next proxy or the Agent."""

METHODS: Final = frozenset(
    {
        INITIALIZE,
        "authenticate",
        "auth/login",
        "auth/logout",
        "auth/status",
        "auth/status_update",
        NEW_SESSION,
        RESUME_SESSION,
        "session/load",
        PROMPT,
        CLOSE_SESSION,
        "session/list",
        "session/delete",
        "session/fork",
        "session/archive",
        "session/unarchive",
        "session/set_title",
        "session/status",
        "session/set_config_option",
        "session/set_mode",
        "session/set_model",
        SESSION_CANCEL,
        SESSION_UPDATE,
        "session/request_permission",
        "tool_call/cancel",
        "fs/read_text_file",
        "fs/write_text_file",
        "terminal/create",
        "terminal/output",
        "terminal/release",
        "terminal/wait_for_exit",
        "terminal/kill",
        "terminal/cancel",
        "document/didOpen",
        "document/didChange",
        "document/didClose",
        "document/didFocus",
        "document/didSave",
        "nes/start",
        "nes/suggest",
        "nes/accept",
        "nes/reject",
        "nes/close",
        ELICITATION_CREATE,
        "elicitation/complete",
        "providers/list",
        "providers/set",
        "providers/disable",
        "mcp/connect",
        "mcp/disconnect",
        "mcp/message",
        "proxy/initialize",
        *SUCCESSORS,
        CANCEL_REQUEST,
    }
)
"""Methods of ACP (v1 and the v2 draft) that label metrics by name; any other is ``other``. A
fault file's ``when.method`` close to one of these but not one of them is named in a note (a
typo)."""


def method_label(method: str | None) -> str:
    """The bounded metrics label of a method (``none`` when a message has no known method)."""
    if method is None:
        return "none"
    return method if method in METHODS else "other"
