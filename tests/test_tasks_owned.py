"""No task without an owner: every ``create_task`` of ``proxy/`` and ``tests/support/`` is listed
here with what owns it.

An owner is a TaskGroup, or an object (or a function) that keeps the task and awaits or cancels
it before it is done with it. Ruff bans ``asyncio.create_task`` (and ``ensure_future``) outright;
``loop.create_task`` and ``TaskGroup.create_task`` are calls on an object that ruff cannot
resolve, so this test finds them in the source instead: a new one fails here until it is listed
with its owner, and an entry whose call has gone fails too. The modules are parsed in a
subprocess, as ``test_layering.py`` does (CPython 3.11 can fail to build an AST in a process
where earlier tests recursed deeply).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from harness import ROOT

SCANNED = ("proxy", "tests/support")

OWNERS = {
    # -- TaskGroups
    "proxy/shell/link.py::Link._spawn": "the link's TaskGroup (Link.run)",
    "proxy/shell/server.py::NetworkProxy._connect": "the proxy's TaskGroup (serve)",
    "proxy/shell/server.py::NetworkProxy.restart": "the proxy's TaskGroup (serve)",
    # -- objects and functions that keep their tasks, and await or cancel them
    "proxy/shell/admin.py::AdminServer._events": "the event stream's handler: cancelled as it ends",
    "proxy/shell/app.py::_serving": "the watcher of the run: cancelled and awaited as it ends",
    "proxy/shell/server.py::_first": "its two waits: cancelled before it returns",
    "proxy/shell/transports/http_upstream.py::HttpUpstream._spawn": (
        "the connection's tasks: cancelled by sever and wait_closed"
    ),
    "proxy/shell/transports/stdio.py::AgentProcess.__init__": "the reaper: awaited by wait_closed",
    "proxy/shell/transports/stdio.py::LineStream.send_sliced": (
        "the slicer: ends by itself, cancelled by sever, awaited through close and wait_closed"
    ),
    "proxy/shell/transports/websocket.py::_WsEndpoint.__init__": (
        "the writer: awaited by wait_closed"
    ),
    "proxy/shell/transports/websocket.py::WsClientEndpoint.receive": (
        "the release ping: cancelled by wait_closed"
    ),
    "proxy/tools/bench/delays.py::delay_check": "the background traffic: awaited before it returns",
    "proxy/tools/bench/processes.py::Server.start": "the server's stderr reader: awaited by stop",
    "proxy/tools/check_client/run.py::_Tail.__init__": (
        "the Client's output reader: awaited, or cancelled after a grace, by end"
    ),
    "proxy/tools/listener.py::ListeningProxy.__init__": (
        "a listening proxy's stderr copy: awaited by stop"
    ),
    "proxy/tools/lab/agent.py::ReferenceAgent.insert_next": (
        "the session's turn (Session.turn): cancelled by session/cancel and session/close"
    ),
    "proxy/tools/lab/agent.py::serve_connections.on_connection": (
        "serve_connections's connections: cancelled when it stops"
    ),
    "proxy/tools/replay/agent.py::serve_replay": (
        "the connection's sender: cancelled and awaited as the connection ends"
    ),
    "proxy/tools/replay/client.py::_Link.play": "the link's reader: cancelled and awaited by play",
    "proxy/tools/rpc.py::Peer.__init__": "the reader: awaited or cancelled by close",
    "proxy/tools/lab/client/retry.py::_answered": (
        "the wait on the followed trace: cancelled before it returns"
    ),
    "proxy/tools/lab/trace_follow.py::TraceFollower.__aenter__": (
        "the follower's reader: cancelled and awaited by __aexit__"
    ),
    "tests/support/harness.py::ProxyProcess.__init__": (
        "the stderr collector: awaited or cancelled as the process is stopped"
    ),
    "tests/support/peers/sdk_remote_client.py::exercise": (
        "the prompt it cancels: cancelled and awaited in place"
    ),
    "tests/support/listener_client.py::SseStream.__init__": (
        "the stream's reader: cancelled and awaited by SseStream.close"
    ),
    "tests/support/stdio_scenario.py::Stderr.__init__": (
        "the SDK Agent's stderr collector: awaited (or cancelled) by Stderr.close"
    ),
    "tests/support/peers/flood_agent.py::Network.receive": (
        "the floods of the peer (Network.tasks), for the life of its process"
    ),
}
"""Each ``create_task`` call, as ``path::enclosing.function``, and what owns its task."""

_SCAN = textwrap.dedent(
    """
    import ast, json, sys
    from pathlib import Path

    root = Path(sys.argv[1])
    found = []

    def visit(node, path, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, path, [*scope, child.name])
                continue
            call = child.func if isinstance(child, ast.Call) else None
            if isinstance(call, ast.Attribute) and call.attr == "create_task":
                found.append([f"{path}::{'.'.join(scope)}", child.lineno])
            visit(child, path, scope)

    for folder in sys.argv[2:]:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            visit(tree, path.relative_to(root).as_posix(), [])
    print(json.dumps(found))
    """
)


def create_task_calls(
    root: Path = ROOT, folders: tuple[str, ...] = SCANNED
) -> list[tuple[str, int]]:
    """Every ``X.create_task(...)`` call in ``folders`` of ``root``: its site and line."""
    done = subprocess.run(
        [sys.executable, "-c", _SCAN, str(root), *folders],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [(site, line) for site, line in json.loads(done.stdout)]


def test_every_task_created_has_a_listed_owner() -> None:
    """A ``create_task`` outside the sites listed is refused: give its task an owner (a
    TaskGroup, or an object that keeps it and awaits or cancels it), then list it."""
    calls = create_task_calls()
    unowned = [f"{site} (line {line})" for site, line in calls if site not in OWNERS]
    assert unowned == [], "tasks without a listed owner; see OWNERS in this file"
    gone = sorted(set(OWNERS) - {site for site, _ in calls})
    assert gone == [], "listed owners whose create_task is gone: remove them from OWNERS"


def test_the_scan_finds_every_form_of_the_call(tmp_path: Path) -> None:
    """On a loop, on a TaskGroup, on the module; in a method, a nested function, at the top."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        textwrap.dedent(
            """
            import asyncio
            asyncio.create_task(job())
            class Owner:
                async def start(self, group):
                    group.create_task(job())
                    def later():
                        asyncio.get_running_loop().create_task(job())
            """
        )
    )
    assert create_task_calls(tmp_path, ("pkg",)) == [
        ("pkg/m.py::", 3),
        ("pkg/m.py::Owner.start", 6),
        ("pkg/m.py::Owner.start.later", 8),
    ]
