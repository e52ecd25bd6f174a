"""The reference Client's options (``proxy.tools.lab.client.options``), checked when made."""

from __future__ import annotations

import pytest

from proxy.tools.lab.client import ClientOptions


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({}, r"^no Agent given: give its command after --, or --connect URL$"),
        ({"agent_argv": ("a",), "connect": "ws://127.0.0.1:1/acp"}, "not both"),
        ({"connect": "tcp://127.0.0.1:1"}, "ws:// or http:// URL"),
        ({"agent_argv": ("a",), "max_attempts": 0}, "at least 1"),
        ({"agent_argv": ("a",), "answer_timeout": 0}, "--answer-timeout must be at least 0.001"),
    ],
)
def test_options_are_checked(fields: dict[str, object], match: str) -> None:
    """One of a command and a URL; a ws or http URL; at least one attempt; positive timeouts."""
    with pytest.raises(ValueError, match=match):
        ClientOptions(**fields)  # type: ignore[arg-type]
