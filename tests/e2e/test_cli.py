"""The command line as a user meets it: help, version, usage errors and exit statuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import TIMEOUT, unboxed
from tool_runs import acp_proxy

from proxy import __version__, core_build


def test_version() -> None:
    """--version prints the package version."""
    done = acp_proxy("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"acp-proxy {__version__} ({core_build()})"


def test_run_help_names_the_options() -> None:
    """run --help documents the options of DESIGN 3 that exist."""
    out = acp_proxy("run", "--help").stdout
    for option in ("--max-message-bytes", "--strict", "--log-format", "--log-level", "AGENT_CMD"):
        assert option in out


def help_at(columns: int, *command: str) -> str:
    """``--help`` of ``command`` in a terminal ``columns`` wide."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env={**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "dumb"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def lone_words(options_help: str) -> list[str]:
    """Lines of the help column holding one word of prose: the help of an option wrapped badly
    (a lone end of a bracketed ``[default: ...]``, ``[env var: ...]`` is click's, and allowed)."""
    lines = options_help.splitlines()
    indents = [len(line) - len(line.lstrip()) for line in lines if line.startswith(" " * 8)]
    assert indents, options_help
    column = min(indents)  # where the help of every option starts
    lone: list[str] = []
    brackets = 0  # [ opened and not yet closed in the current option's help
    for line in lines:
        text = line[column:]
        if line.strip() and not line.startswith(" " * column):  # an option's names
            brackets = 0
            if line[column - 2 : column] != "  ":  # names too long: the help starts below
                text = ""
        if len(text.split()) == 1 and brackets == 0:
            lone.append(line)
        brackets += text.count("[") - text.count("]")
    return lone


def test_run_help_reads_well_at_80_columns() -> None:
    """run --help at 80 columns: every line fits, no flag shows a type (`<bool>`), and no word
    of an option's help stands alone on a line."""
    text = help_at(80, "run")
    assert "<bool>" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    options = text.split("\nOptions:\n", 1)[1]
    assert "  --strict  " in options  # a flag: its name, then its help
    assert "  --faults FILE  " in options
    assert lone_words(options) == []


def test_no_command_shows_a_type_on_a_flag() -> None:
    """No command's help gives a flag (--json, --strict, --help...) a `<bool>` type."""
    commands = ["run", "validate", "schema", "agent", "check-agent", "client", "demo", "report"]
    for command in ([], *([name] for name in commands), ["bench"]):
        assert "<bool>" not in help_at(80, *command), command


def test_help_shows_placeholders_not_python_types() -> None:
    """Arguments and options are named by what a user gives (FILE, SECONDS, ADDRESS), never by
    their Python type (`<list[Path]>`, `<str>`, `<float range>`); choices are listed."""
    commands = ["run", "validate", "schema", "agent", "check-agent", "client", "demo", "report"]
    for command in (*([name] for name in commands), ["bench"]):
        text = help_at(120, *command)
        types = [word for word in text.split() if word.startswith("<") and "|" not in word]
        assert types == [], command
    assert "  TRACE  " in help_at(120, "report")
    assert "  --only, --trace T0..T7  " in help_at(120, "check-agent")


def test_run_without_an_agent_is_a_usage_error() -> None:
    """Without an Agent command, run exits 2 with a message on stderr and nothing on stdout."""
    done = acp_proxy("run")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "AGENT_CMD" in done.stderr


def test_bad_option_values_are_usage_errors() -> None:
    """Invalid option values are refused before anything starts."""
    assert acp_proxy("run", "--max-message-bytes", "0", "--", "true").returncode == 2
    assert acp_proxy("run", "--log-level", "loud", "--", "true").returncode == 2


def test_agent_arguments_after_the_separator_are_not_proxy_options() -> None:
    """Everything after -- belongs to the Agent, options included."""
    done = acp_proxy(
        "run", "--", sys.executable, "-c", "import sys; sys.exit(len(sys.argv))", "--strict"
    )
    assert done.returncode == 2  # argv of the agent: [-c, --strict]


def test_regular_files_as_stdin_and_stdout(tmp_path: Path) -> None:
    """Files (which the event loop cannot poll) are bridged: the relay runs as with pipes."""
    source, sink = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [b'{"jsonrpc":"2.0","id":"a%d","method":"m"}' % n for n in range(2000)]
    source.write_bytes(b"\n".join(lines) + b"\n")
    with source.open("rb") as stdin, sink.open("wb") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "run", "--", "cat"],
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            timeout=TIMEOUT,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    # cat echoes each request back: the Client gets them as requests under the proxy's ids,
    # every one of them, even though the proxy exits right after its stdin ends.
    expected = [b'{"jsonrpc":"2.0","id":%d,"method":"m"}' % n for n in range(2000)]
    assert sink.read_bytes().splitlines() == expected


def test_dev_null_as_stdin() -> None:
    """/dev/null (not pollable) is an immediate end of input, not a crash."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "run", "--", "cat"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--admin", "::1:0", "expected HOST:PORT (an IPv6 address in brackets: [::1]:PORT)"),
        ("--admin", "[::1:0", "expected HOST:PORT"),
        ("--admin", "[::1]", "expected HOST:PORT"),
        ("--admin", "127.0.0.1:70000", "expected HOST:PORT"),
        ("--admin", "127.0.0.1:0/x", "expected HOST:PORT"),
        ("--admin", "[::1]x:0", "expected HOST:PORT"),
        ("--admin", "[v1.x]:0", "expected HOST:PORT"),
        ("--admin", "local host:0", "expected HOST:PORT"),
        ("--listen", "ws://[::1:0/acp", "expected stdio, http://HOST:PORT/PATH"),
    ],
)
def test_malformed_addresses_are_usage_errors(option: str, value: str, expected: str) -> None:
    """An address that is not HOST:PORT (an IPv6 one without its brackets, an unclosed bracket)
    is refused with exit 2 and a message saying what is expected, before anything starts."""
    done = acp_proxy("run", option, value, "--", "true")
    assert done.returncode == 2, done.stderr
    assert expected in unboxed(done.stderr)
    assert "Traceback" not in done.stderr
