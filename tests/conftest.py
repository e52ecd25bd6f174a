"""Fixtures every test folder shares (helpers live in ``tests/support``, on pytest's path)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import ProxyProcess


@pytest.fixture
async def proxies() -> AsyncIterator[list[ProxyProcess]]:
    """Proxy processes a test starts (it appends them); killed at the end if still running."""
    started: list[ProxyProcess] = []
    try:
        yield started
    finally:
        for proxy in started:
            await proxy.stop()


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    """The file the scripted raw Agent (``harness.raw_agent``) records every line it reads into."""
    return tmp_path / "agent-saw.jsonl"
