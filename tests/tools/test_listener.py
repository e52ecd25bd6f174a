"""A proxy a tool runs as a listener (``proxy.tools.listener``): its URL from its log, its log in
a file, stopped; one that exits before listening is told, never waited for."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from proxy.tools.listener import ListeningProxy, NotListening

PYTHON = sys.executable


async def test_a_listening_proxy_gives_its_url_and_stops(tmp_path: Path) -> None:
    """The URL its ``listening`` line names (port 0 chosen); its log lines in the file, watched
    as they pass; SIGTERM ends it."""
    log = tmp_path / "proxy.log"
    seen: list[bytes] = []
    command = [PYTHON, "-m", "proxy", "run", "--listen", "ws://127.0.0.1:0/acp",
               "--log-format", "json", "--log-level", "info", "--", PYTHON, "-m", "proxy", "agent"]  # fmt: skip
    proxy = await ListeningProxy.start(command, log.open("ab"), seen.append)
    try:
        assert proxy.url.startswith("ws://127.0.0.1:")
        assert not proxy.url.startswith("ws://127.0.0.1:0/")
    finally:
        await proxy.stop()
    assert proxy.process.returncode == 0
    assert b'"listening"' in log.read_bytes()
    assert seen  # what followed the listening line (its closing lines) went by the watcher


async def test_a_proxy_that_exits_before_listening_is_told(tmp_path: Path) -> None:
    """Its stderr kept in the log file, :class:`NotListening` at once."""
    log = tmp_path / "proxy.log"
    failing = [PYTHON, "-c", "import sys; sys.stderr.write('no such option\\n'); sys.exit(2)"]
    with pytest.raises(NotListening, match="the proxy did not start"):
        await ListeningProxy.start(failing, log.open("ab"))
    assert log.read_bytes() == b"no such option\n"
