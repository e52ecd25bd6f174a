"""What check-client checks, and how: :class:`ClientCheckOptions`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.errors import OptionError, at_least

__all__ = ["AGENT", "AGENT_JSON", "URL", "ClientCheckOptions"]

AGENT = "{agent}"
"""Replaced by the command of the Agent the checker controls: its words (an argument that is
exactly this), or its shell-quoted command line (inside a longer argument)."""
AGENT_JSON = "{agent-json}"
"""Replaced by the Agent's command as a JSON array of strings."""
URL = "{url}"
EVERY_SCENARIO = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7")
"""Replaced by the URL the checker serves the Agent on (``--listen``)."""
MIN_WAIT = 0.1
"""The least the checker gives a Client to resend or to run: less would judge it by the load."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientCheckOptions:
    """What to check, and how.

    ``client_argv`` is the Client under test, run once per fault setup; it names its Agent with
    ``{agent}`` or ``{agent-json}`` (the checker's Agent over stdio) or, with ``listen``,
    ``{url}`` (the checker's Agent served on that address).
    """

    client_argv: tuple[str, ...]
    listen: str | None = None
    """``http://127.0.0.1:0/acp`` or ``ws://...``: serve the Agent there, for a network Client."""
    prompts: int = 1
    """How many prompts the Client sends on its own in a run."""
    retry_window: float = 30.0
    """Seconds after a loss within which a resend counts."""
    client_timeout: float = 60.0
    """Seconds a run of the Client may last: then it is stopped (its process group) and judged
    on what it did."""
    scenarios: tuple[str, ...] = EVERY_SCENARIO

    def __post_init__(self) -> None:
        from proxy.tools.check_client.scenarios import SCENARIOS  # noqa: PLC0415 - they use these

        if not self.client_argv:
            raise OptionError("give the Client's command after --", option="CLIENT_CMD")
        if self.listen is not None and not self.listen.startswith(("http://", "ws://")):
            raise OptionError(f"expected an http:// or ws:// URL, got {self.listen!r}", "--listen")
        words = " ".join(self.client_argv)
        if self.listen is None and AGENT not in words and AGENT_JSON not in words:
            url = f"; {URL} is for a network Client, with --listen" if URL in words else ""
            raise OptionError(
                f"the Client's command must name its Agent with {AGENT} or {AGENT_JSON} "
                f"(or, with --listen, its URL with {URL}){url}",
                option="CLIENT_CMD",
            )
        if self.listen is not None and URL not in words:
            raise OptionError(
                f"with --listen the Client's command must name the URL with {URL}",
                option="CLIENT_CMD",
            )
        at_least("--prompts", self.prompts, 1)
        at_least("--retry-window", self.retry_window, MIN_WAIT)
        at_least("--client-timeout", self.client_timeout, MIN_WAIT)
        unknown = [name for name in self.scenarios if name not in SCENARIOS]
        if unknown:
            raise OptionError(f"unknown scenarios {unknown}; known: {list(SCENARIOS)}", "--only")

    @property
    def transport(self) -> str:
        """How the Client reaches the Agent: ``stdio``, ``http`` or ``ws``."""
        return "stdio" if self.listen is None else self.listen.split(":", 1)[0]

    @classmethod
    def from_command_line(
        cls, *, client_argv: Sequence[str], scenarios: Sequence[str] = (), **settings: Any
    ) -> ClientCheckOptions:
        """The options of ``acp-proxy check-client``: ``scenarios`` the names of those to run
        (none: every one)."""
        if scenarios:  # in the scenarios' order, each once; c1 is C1
            chosen = {name.upper() for name in scenarios}
            known = [name for name in EVERY_SCENARIO if name in chosen]
            settings["scenarios"] = tuple(known) + tuple(sorted(chosen.difference(known)))
        return cls(client_argv=tuple(client_argv), **settings)
