"""What the reference Client does, and to which Agent: :class:`ClientOptions`."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from proxy.core.errors import OptionError, at_least
from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES, MIN_TIMEOUT
from proxy.shell.tls import check_upstream

__all__ = ["ClientOptions", "KeyMode", "check_reach"]


def check_reach(
    agent_argv: tuple[str, ...], connect: str | None, tls: ssl.SSLContext | None
) -> None:
    """Refuse a way to reach the Agent that is none or two (a command and a URL), a URL that is
    no ``ws://`` or ``http://`` (``wss://``, ``https://``) one, or a trust for an Agent not in
    TLS: an :class:`~proxy.core.errors.OptionError`."""
    if agent_argv and connect is not None:
        raise OptionError("give either an agent command or a URL to connect to, not both")
    if not agent_argv and connect is None:
        raise OptionError("no Agent given: give its command after --, or --connect URL")
    if connect is not None and not connect.startswith(("ws://", "wss://", "http://", "https://")):
        raise OptionError(f"expected a ws:// or http:// URL, got {connect!r}")
    secure = connect is not None and connect.startswith(("wss://", "https://"))
    check_upstream(secure=secure, verified=tls is not None)


KeyMode = Literal["fresh", "none", "reuse", "from_text"]
"""How the Client makes its idempotency keys: ``fresh``, a UUID4 per submission (the RFD); the
others break the RFD on purpose, for the tests of ``acp-proxy check-client``: ``none`` sends no
key (``--no-key``), ``reuse`` one key for every submission of the run (``--reuse-key``),
``from_text`` a key derived from the prompt's text (``--key-from-text``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientOptions:
    """What the reference Client does, and to which Agent.

    Exactly one of ``agent_argv`` (a command spawned over stdio, typically ``acp-proxy run ...
    -- AGENT``; respawned after it exits) and ``connect`` (a ``ws://`` or ``http://`` URL;
    connected again after the connection ends) is given.
    """

    agent_argv: tuple[str, ...] = ()
    connect: str | None = None
    prompts: tuple[str, ...] = ()
    answer_timeout: float = 10.0
    """Seconds to wait for a prompt's answer before its outcome counts as unknown (then resent)."""
    max_attempts: int = 5
    """Requests per submission (and tries per reconnection) before giving up."""
    cwd: str = "/"
    setup_timeout: float = 30.0
    """Seconds to wait for an answer to ``initialize``, ``session/new`` or ``session/resume``
    (a command just spawned, a Python Agent behind a proxy, starts in seconds on a busy
    machine)."""
    verify: bool = True
    """Resume the session with a full replay at the end, to count the copies in history."""
    grace: float = 5.0
    """Seconds a spawned command gets to exit after its stdin closes (then SIGTERM, SIGKILL)."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    follow_trace: Path | None = None
    """The trace (``--trace``) of the proxy in front of the Agent, used by this Client alone
    (:mod:`proxy.tools.lab.trace_follow`): an answer it says is lost (dropped, or owed by an
    Agent the proxy replaced) counts as timed out at once, and the final replay waits
    (``answer_timeout`` at most) until the proxy has nothing held for the Agent or outstanding
    there."""
    tls: ssl.SSLContext | None = None
    """How a ``wss://`` or ``https://`` Agent is verified (``--tls-ca``; None: the system's
    trust store)."""
    keys: KeyMode = "fresh"
    """How keys are made: anything but ``fresh`` misbehaves on purpose (:data:`KeyMode`)."""

    def __post_init__(self) -> None:
        check_reach(self.agent_argv, self.connect, self.tls)
        at_least("--answer-timeout", self.answer_timeout, MIN_TIMEOUT)
        at_least("--max-attempts", self.max_attempts, 1)
        at_least("setup_timeout", self.setup_timeout, MIN_TIMEOUT)
        at_least("grace", self.grace, 0)
        at_least("max_message_bytes", self.max_message_bytes, 1)
        if self.keys not in get_args(KeyMode):
            raise OptionError(f"keys: expected one of {list(get_args(KeyMode))}, got {self.keys!r}")

    @property
    def transport(self) -> str:
        """``stdio``, ``ws`` or ``http``."""
        if self.connect is None:
            return "stdio"
        return "ws" if self.connect.startswith("ws") else "http"
