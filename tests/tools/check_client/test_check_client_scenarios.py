"""``acp-proxy check-client`` against real Clients: the reference Client passes every scenario; the
reference Client misbehaving on purpose (``--no-key``, ``--reuse-key``, ``--key-from-text``), a
Client that resends its cancels and the official Python SDK's Client (no keys) fail or skip the
scenarios concerned, with the evidence; the JUnit file parses; a Client that hangs is stopped."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from harness import PEERS, TIMEOUT
from tool_runs import check_client

pytestmark = pytest.mark.slow

PROXY = [sys.executable, "-m", "proxy"]
REFERENCE = [*PROXY, "client", "--answer-timeout", "1", "-p", "hello"]
"""The reference Client over stdio: the checker's Agent goes after ``--``."""
BOUNDS = ["--retry-window", "15", "--client-timeout", "40"]


def verdicts(*args: str, status: int) -> dict[str, dict[str, Any]]:
    """The results of ``check-client --json ARGS`` by scenario, its exit status checked."""
    done = check_client("--json", *args)
    assert done.returncode == status, done.stdout + done.stderr
    return {result["scenario"]: result for result in json.loads(done.stdout)}


def statuses(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: result["status"] for name, result in results.items()}


def test_the_reference_client_passes_every_scenario(tmp_path: Path) -> None:
    """C0-C7 all PASS; the JUnit file holds one passing test case per scenario."""
    junit = tmp_path / "junit.xml"
    results = verdicts("--junit", str(junit), *BOUNDS, "--", *REFERENCE, "--", "{agent}", status=0)
    assert statuses(results) == {f"C{n}": "PASS" for n in range(8)}, results
    assert "with the same key" in results["C1"]["reason"]
    assert "session/resume" in results["C2"]["reason"]
    assert "session/resume" in results["C3"]["reason"]
    assert "refused with -32603" in results["C4"]["reason"]
    suite = ElementTree.parse(junit).getroot()
    assert suite.get("name") == "acp-check-client-stdio"
    assert [suite.get(n) for n in ("tests", "failures", "errors", "skipped")] == [
        "8",
        "0",
        "0",
        "0",
    ]
    assert [case.get("name", "")[:2] for case in suite.iter("testcase")] == list(results)
    assert not [child for case in suite.iter("testcase") for child in case]


def test_a_client_that_sends_no_keys_fails_the_key_scenarios() -> None:
    """``--no-key``: no key (C0), resends without one after each loss (C1-C3, C7); C4 and C5
    have no key to judge."""
    results = verdicts(*BOUNDS, "--", *REFERENCE, "--no-key", "--", "{agent}", status=1)
    assert statuses(results) == {
        "C0": "FAIL", "C1": "FAIL", "C2": "FAIL", "C3": "FAIL",
        "C4": "SKIP", "C5": "SKIP", "C6": "PASS", "C7": "FAIL",
    }  # fmt: skip
    assert "carried no valid idempotencyKey" in results["C0"]["reason"]
    for name in ("C1", "C2", "C3"):
        assert "resent without a key" in results[name]["reason"]
    assert "unkeyed_resend" in results["C7"]["reason"]


def test_a_client_that_reuses_one_key_fails_c4_and_c5() -> None:
    """``--reuse-key`` with two prompts: the refused prompt's key comes back with the other
    prompt (C4); one key for two prompts (C5, the ledger's finding); a key sent again (C0)."""
    client = [*PROXY, "client", "--answer-timeout", "1", "--reuse-key", "-p", "one", "-p", "two"]
    only = ["--only", "C0", "--only", "C4", "--only", "C5", "--prompts", "2"]
    results = verdicts(*only, *BOUNDS, "--", *client, "--", "{agent}", status=1)
    assert statuses(results) == {"C0": "FAIL", "C4": "FAIL", "C5": "FAIL"}, results
    assert "came back with another prompt" in results["C4"]["reason"]
    assert "key_reused_other_prompt" in results["C5"]["reason"]
    assert "a new submission needs a new key" in results["C0"]["reason"]


def test_a_client_whose_keys_come_from_the_text_fails_c0() -> None:
    """``--key-from-text``: the same prompt gets the same key in every run."""
    client = [*PROXY, "client", "--answer-timeout", "1", "--key-from-text", "-p", "same"]
    only = ["--only", "C0", "--only", "C4"]
    results = verdicts(*only, *BOUNDS, "--", *client, "--", "{agent}", status=1)
    assert results["C0"]["status"] == "FAIL"
    assert "derived from the text" in results["C0"]["reason"]


def test_a_client_that_resends_its_cancel_fails_c6() -> None:
    """``session/cancel`` twice for one turn (and ``$/cancel_request`` of an answered id)."""
    client = [sys.executable, str(PEERS / "cancelling_client.py"), "--", "{agent}"]
    results = verdicts("--only", "C6", *BOUNDS, "--", *client, status=1)
    assert results["C6"]["status"] == "FAIL"
    assert "sent again" in results["C6"]["reason"]


def test_the_sdk_client_is_reported_as_a_v1_client_not_crashed_on() -> None:
    """The official Python SDK's Client (protocol 1, no keys, never resends; a lost answer
    leaves it waiting until the checker stops it): every scenario SKIP, saying it is a v1
    Client; nothing checked, exit 2; never an ERROR."""
    client = [sys.executable, str(PEERS / "sdk_client.py"), "hello", "--", "{agent}"]
    bounds = ["--retry-window", "2", "--client-timeout", "6"]
    results = verdicts(*bounds, "--", *client, status=2)
    assert statuses(results) == {f"C{n}": "SKIP" for n in range(8)}, results
    for result in results.values():
        assert result["reason"].startswith("a Client of ACP v1: it asked initialize for protocol")


@pytest.mark.parametrize("scheme", ["ws", "http"])
def test_a_network_client_is_served_the_agent_at_url(scheme: str) -> None:
    """``--listen``: the reference Client connects to ``{url}``, reconnects after the cut (C2)
    and after the Agent was killed (C3)."""
    client = [*PROXY, "client", "--answer-timeout", "1", "-p", "hello", "--connect", "{url}"]
    listen = ["--listen", f"{scheme}://127.0.0.1:0/acp", "--only", "C2", "--only", "C3"]
    results = verdicts(*listen, *BOUNDS, "--", *client, status=0)
    assert statuses(results) == {"C2": "PASS", "C3": "PASS"}, results


def test_a_client_that_hangs_is_stopped_and_nothing_is_checked() -> None:
    """A Client that never starts its Agent and never exits: stopped after --client-timeout
    (its process group), every scenario SKIP with the reason, exit 2."""
    hanging = [sys.executable, "-c", "import time; time.sleep(600)", "{agent}"]
    started = time.monotonic()
    done = check_client("--only", "C0", "--only", "C1", "--client-timeout", "1", "--", *hanging)
    assert time.monotonic() - started < 60
    assert done.returncode == 2, done.stdout + done.stderr
    assert "never started the Agent" in done.stdout
    assert "stopped after 1 s" in done.stdout
    assert "nothing was checked: every scenario was skipped (exit status 2)" in done.stdout


def test_a_client_that_writes_without_end_is_quoted_by_its_last_line() -> None:
    """Megabytes of output cost the checker the last few hundred bytes: the verdict quotes the
    last line."""
    loud = [sys.executable, "-c", "print('x' * 5_000_000); print('my last words')", "{agent}"]
    done = check_client("--only", "C0", "--", *loud)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "its last words: my last words" in done.stdout


def test_usage_errors_are_told_before_anything_runs(tmp_path: Path) -> None:
    """No Agent named, an unknown scenario, a Client that is not there: exit 2, one line."""
    unnamed = check_client("--", *REFERENCE)
    assert unnamed.returncode == 2
    assert "{agent}" in unnamed.stderr
    unknown = check_client("--only", "C9", "--", *REFERENCE, "--", "{agent}")
    assert unknown.returncode == 2
    assert "unknown scenarios ['C9']" in unknown.stderr
    missing = check_client("--", "/nonexistent/client", "{agent}")
    assert missing.returncode == 2
    assert "cannot run the Client: '/nonexistent/client' is not an executable" in missing.stderr
    junit = tmp_path / "nowhere" / "junit.xml"
    refused = check_client("--junit", str(junit), "--", *REFERENCE, "--", "{agent}")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert "does not exist" in refused.stderr


def test_a_client_that_sends_fewer_prompts_than_announced_fails_c0() -> None:
    """--prompts 2 and a Client that sends one: C0 says how many submissions the run held."""
    results = verdicts(
        "--only", "C0", "--prompts", "2", *BOUNDS, "--", *REFERENCE, "--", "{agent}", status=1
    )
    assert "1 submission in the plain run, where --prompts says 2" in results["C0"]["reason"]


HANGING_CLIENT = """
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "600"])
with open(sys.argv[1], "w") as fifo:
    fifo.write(f"{os.getpid()} {child.pid}")
time.sleep(600)
"""
"""A Client that starts a child in its process group, says both pids, and hangs."""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_check_stops_the_clients_whole_process_group(
    signum: int, tmp_path: Path
) -> None:
    """Ctrl-C (or SIGTERM) during a run: the checker stops the Client and what it started
    (its process group), says so, and exits 130; killed outright, its orphan guard stops them."""
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    checker = subprocess.Popen(
        [*PROXY, "check-client", "--only", "C0", "--", sys.executable, "-c", HANGING_CLIENT,
         str(fifo), "{agent}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_at_the_terminal,  # noqa: PLW1509 - one signal.signal, before exec
    )  # fmt: skip
    with checker:  # its pipes closed whatever happens (a leak would be blamed on a later test)
        ends, err = _interrupt(checker, fifo, signum)
    try:
        if signum == signal.SIGKILL:
            assert checker.returncode == -signal.SIGKILL
        else:
            assert checker.returncode == 130, err
            assert "interrupted; the Client was stopped" in err
        for end in ends:  # the Client and its child
            assert select.select([end], [], [], TIMEOUT)[0], "a process of the Client is left"
    finally:
        for end in ends:
            os.close(end)


def _at_the_terminal() -> None:
    """In the checker before it runs: SIGINT at its default, as in a shell's foreground job. A
    suite run in the background (``pytest &``, CI under ``nohup``) has it ignored, and an
    ignored signal stays ignored across exec: the checker would then rightly not hear Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(checker: subprocess.Popen[str], fifo: Path, signum: int) -> tuple[list[int], str]:
    """Once the hanging Client said its pids: a pidfd of each, ``signum`` sent to the checker,
    its stderr when it ended (killed after TIMEOUT if it does not)."""
    try:
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            assert select.select([reader], [], [], TIMEOUT)[0], "the Client never started"
            pids = [int(pid) for pid in _read_all(reader).split()]
        finally:
            os.close(reader)
        ends = [os.pidfd_open(pid) for pid in pids]  # readable once the process has ended
        checker.send_signal(signum)
        _, err = checker.communicate(timeout=TIMEOUT)
        return ends, err
    finally:
        if checker.poll() is None:
            checker.kill()
            checker.wait()


def _read_all(fd: int) -> str:
    """What the writer of the FIFO ``fd`` wrote, up to its closing (each read waited for)."""
    data = b""
    while select.select([fd], [], [], TIMEOUT)[0]:
        chunk = os.read(fd, 100)
        if not chunk:
            break
        data += chunk
    return data.decode()


def test_c0_alone_still_compares_two_runs() -> None:
    """``--only C0`` with keys derived from the text: C0 needs the same text in two runs, so the
    checker runs the Client twice even though no other scenario asks for a second run."""
    client = [*PROXY, "client", "--answer-timeout", "1", "--key-from-text", "-p", "same"]
    results = verdicts("--only", "C0", *BOUNDS, "--", *client, "--", "{agent}", status=1)
    assert results["C0"]["status"] == "FAIL"
    assert "derived from the text" in results["C0"]["reason"]


def test_a_client_that_fails_before_the_agent_is_run_once() -> None:
    """A Client that exits 1 before it starts the Agent: the reason says it failed (not that it
    may be a v1 Client), and the other setups are not run for the same end."""
    failing = [sys.executable, "-c", "import sys; sys.exit('no such file: client.py')", "{agent}"]
    done = check_client("--only", "C0", "--only", "C1", "--json", "--", *failing)
    assert done.returncode == 2, done.stdout + done.stderr
    results = {result["scenario"]: result for result in json.loads(done.stdout)}
    assert statuses(results) == {"C0": "SKIP", "C1": "SKIP"}
    assert "exited with status 1" in results["C0"]["reason"]
    assert "it failed before it reached the Agent" in results["C0"]["reason"]
    assert "v1 Client" not in results["C0"]["reason"]
    assert results["C1"]["reason"].startswith("not run: in the plain run, the Client never")


def test_a_proxy_that_cannot_listen_says_why(tmp_path: Path) -> None:
    """--listen on a port in use: the scenarios are ERROR, with the proxy's own reason."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        client = [*PROXY, "client", "--answer-timeout", "1", "-p", "hello", "--connect", "{url}"]
        listen = ["--listen", f"http://127.0.0.1:{port}/acp", "--only", "C1"]
        results = verdicts(*listen, *BOUNDS, "--", *client, status=2)
    finally:
        taken.close()
    assert results["C1"]["status"] == "ERROR"
    assert "the proxy did not start: --listen" in results["C1"]["reason"]
    assert "address already in use" in results["C1"]["reason"]
