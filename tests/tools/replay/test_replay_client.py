"""``acp-proxy replay client`` against the reference Agent: the same answers pass, a changed one
is reported with where, what was recorded and what came."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness import TIMEOUT


def proxy(*args: str) -> list[str]:
    return [sys.executable, "-m", "proxy", *args]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        proxy(*args), capture_output=True, text=True, timeout=TIMEOUT * 4, check=False
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session of the reference Client and Agent recorded through the proxy (plain JSONL)."""
    path = tmp_path_factory.mktemp("record") / "session.jsonl"
    done = run("client", "--", *proxy("run", "--record", str(path), "--", *proxy("agent")))
    assert done.returncode == 0, done.stderr
    return path


def test_the_same_agent_answers_the_same(recorded: Path) -> None:
    """Against the Agent recorded, nothing differs (its random ids and session ids aside)."""
    done = run("replay", "client", str(recorded), "--", *proxy("agent"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.endswith("messages of the Agent compared: same as recorded\n")


def changed(recorded: Path, directory: Path) -> Path:
    """The recording with the Agent's "running" state said as "walking" (gzip, as --record
    writes a .gz)."""
    text = recorded.read_bytes().replace(b'"state":"running"', b'"state":"walking"')
    assert b"walking" in text
    path = directory / "changed.jsonl.gz"
    path.write_bytes(gzip.compress(text))
    return path


def test_a_changed_answer_is_reported(recorded: Path, tmp_path: Path) -> None:
    """Exit 1; each difference on a line: the recorded line, the method, the path, the values."""
    done = run("replay", "client", str(changed(recorded, tmp_path)), "--", *proxy("agent"))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("line ")
        and line.endswith(': session/update params.update.state: recorded "walking", new "running"')
        for line in lines
    ), done.stdout
    as_json = run(
        "replay", "client", str(changed(recorded, tmp_path)), "--json", "--", *proxy("agent")
    )
    report = json.loads(as_json.stdout)
    assert {
        "method": "session/update",
        "path": "params.update.state",
        "recorded": "walking",
        "got": "running",
    } in [{k: v for k, v in d.items() if k != "line"} for d in report["differences"]]


def test_ignored_paths_are_no_difference(recorded: Path, tmp_path: Path) -> None:
    """--ignore the path that changed: exit 0."""
    path = changed(recorded, tmp_path)
    done = run(
        "replay", "client", str(path), "--ignore", "params.update.state", "--", *proxy("agent")
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_agent_that_cannot_be_started_is_said(recorded: Path, tmp_path: Path) -> None:
    """Exit 2 with the reason."""
    done = run("replay", "client", str(recorded), "--", str(tmp_path / "no-such-agent"))
    assert done.returncode == 2
    assert "cannot reach the Agent" in done.stderr
