"""What a bench run does: :class:`BenchOptions`, its defaults and the short run's tiny counts."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from typing import Any

from proxy.core.errors import at_least

__all__ = ["WS_LINKS", "BenchOptions"]

WS_LINKS = 1000
"""Concurrent WebSocket links of a full run (DESIGN 11's target)."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What a bench run does."""

    requests: int = 2000
    notifications: int = 200_000
    """Notifications of a stream: at the millions a second a direct Client reads, 20,000 took
    5 ms, too short a run for its rate to mean anything."""
    prompts: int = 300
    rounds: int = 3
    memory_check: int = 0
    """Messages of the long-run memory check (0: no check)."""
    ws_links: int = WS_LINKS
    """Concurrent WebSocket links to open through one proxy (0: none)."""
    delays: int = 200
    """Delayed requests per variant of the injected-delay check (0: no check)."""
    short: bool = False
    socat: str | None = None
    """The socat executable, or ``None`` for no byte-relay column."""
    websocket: bool = True
    """Whether the WebSocket columns are run."""
    mitmdump: str | None = None
    """The mitmdump executable, or ``None`` for no mitmproxy column over WebSocket."""
    fixed_allocator: bool = False
    """Whether every process runs with glibc's allocator thresholds fixed (see
    :mod:`proxy.tools.bench.run`); else each with glibc's own, as a relay is usually run."""
    python: str = sys.executable

    def __post_init__(self) -> None:
        at_least("--requests", self.requests, 1)
        at_least("--notifications", self.notifications, 1)
        at_least("--prompts", self.prompts, 1)
        at_least("--rounds", self.rounds, 1)
        at_least("--memory-check", self.memory_check, 0)
        at_least("--ws-links", self.ws_links, 0)
        at_least("--delays", self.delays, 0)

    @classmethod
    def short_run(cls, **changes: Any) -> BenchOptions:
        """Tiny counts, for CI: checks that everything runs, not how fast."""
        values: dict[str, Any] = {
            "requests": 30,
            "notifications": 300,
            "prompts": 10,
            "rounds": 1,
            "ws_links": 100,
            "delays": 10,
            "short": True,
            "socat": shutil.which("socat"),
            "mitmdump": shutil.which("mitmdump"),
        }
        values.update(changes)
        return cls(**values)
