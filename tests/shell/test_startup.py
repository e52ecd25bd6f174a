"""A proxy that cannot start says why in one line and exits 1, without a traceback.

Each case is real: a port held by a listening socket of the test, a privileged port, a directory
the proxy may not write, a symbolic link or a FIFO planted where the trace goes, state files that
are not JSON, of another shape or another version. The proxy runs as a subprocess
(``python -m proxy run``); its whole stderr must be the one line ``acp-proxy: OPTION VALUE:
CAUSE``, and the Agent must never have started (it would create a marker file), but for the
control API of a stdio proxy, which listens once its Agent has started (then killed).

Permissions: as root, the proxy runs without the capabilities that let root ignore them
(``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``, ``CAP_NET_BIND_SERVICE`` dropped from its bounding
set before it is executed); where that cannot be done those tests are skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness import TIMEOUT

from proxy.shell.writable import cannot_write_in

EXIT_CANNOT_START = 1
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_NET_BIND_SERVICE = 1, 2, 10
PRIVILEGED_PORT = 80


def _drop_privileges() -> None:
    """In the child, before exec: a root process gets none of these capabilities after exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_NET_BIND_SERVICE):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            os._exit(125)


Preexec = Callable[[], None] | None


@pytest.fixture(scope="module")
def unprivileged(tmp_path_factory: pytest.TempPathFactory) -> Preexec:
    """What makes a child of this process subject to permissions (nothing unless root); the
    test is skipped when that cannot be had."""
    if os.geteuid() != 0:
        return None
    closed = tmp_path_factory.mktemp("closed")
    closed.chmod(0o500)
    probe = subprocess.run(
        [sys.executable, "-c", f"open({str(closed / 'x')!r}, 'w')"],
        preexec_fn=_drop_privileges,
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    if probe.returncode == 0:
        pytest.skip("root here cannot give up its capabilities")
    return _drop_privileges


def run(tmp_path: Path, *options: str, preexec: Preexec = None) -> str:
    """``acp-proxy run OPTIONS -- AGENT``; the line that says why it could not start, once checked
    that it exited 1, without a traceback, with nothing on stdout.

    Nothing else is on stderr and the Agent never started (a stdio proxy's control API too
    binds first: it once started the Agent, then killed it, and logged the Client as gone)."""
    marker = tmp_path / "agent-started"
    agent = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "run", *options, "--", *agent],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
        preexec_fn=preexec,
    )
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_CANNOT_START, stderr
    assert done.stdout == b""
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert not marker.exists()
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 on which the test listens."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


# -- addresses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("listen", [[], ["--listen", "ws://127.0.0.1:0/acp"]], ids=["stdio", "ws"])
def test_an_admin_port_in_use(tmp_path: Path, taken_port: int, listen: list[str]) -> None:
    line = run(tmp_path, "--admin", f"127.0.0.1:{taken_port}", *listen)
    assert line == f"acp-proxy: --admin 127.0.0.1:{taken_port}: address already in use"


@pytest.mark.parametrize("scheme", ["ws", "http"])
def test_a_listen_port_in_use(tmp_path: Path, taken_port: int, scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:{taken_port}/acp"
    line = run(tmp_path, "--listen", url)
    assert line == f"acp-proxy: --listen {url}: address already in use"


def test_an_ipv6_admin_port_in_use(tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    with socket.socket(socket.AF_INET6) as holder:
        try:
            holder.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback")
        holder.listen()
        port = holder.getsockname()[1]
        line = run(tmp_path, "--admin", f"[::1]:{port}")
    assert line == f"acp-proxy: --admin [::1]:{port}: address already in use"


def _privileged() -> bool:
    with contextlib.suppress(OSError):
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text()) > 80
    return sys.platform != "linux"


@pytest.mark.skipif(not _privileged(), reason="port 80 is not privileged on this machine")
@pytest.mark.parametrize("option", ["--admin", "--listen"])
def test_a_privileged_port(tmp_path: Path, unprivileged: Preexec, option: str) -> None:
    value = f"127.0.0.1:{PRIVILEGED_PORT}"
    if option == "--listen":
        value = f"ws://{value}/acp"
    line = run(tmp_path, option, value, preexec=unprivileged)
    assert line == f"acp-proxy: {option} {value}: permission denied"


# -- the trace -----------------------------------------------------------------------------------


@pytest.fixture
def closed_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody may write in (nor list)."""
    closed = tmp_path / "closed"
    closed.mkdir()
    closed.chmod(0o100)
    yield closed
    closed.chmod(0o700)


def test_a_trace_in_a_directory_that_cannot_be_written(
    tmp_path: Path, unprivileged: Preexec, closed_directory: Path
) -> None:
    path = closed_directory / "trace.jsonl"
    line = run(tmp_path, "--trace", str(path), preexec=unprivileged)
    assert line == f"acp-proxy: --trace {path}: permission denied"


def test_a_trace_in_a_directory_that_does_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "trace.jsonl"
    line = run(tmp_path, "--trace", str(path))
    assert line == f"acp-proxy: --trace {path}: no such file or directory"


def test_a_symbolic_link_planted_as_the_trace_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    path = tmp_path / "trace.jsonl"
    path.symlink_to(target)
    line = run(tmp_path, "--trace", str(path))
    assert line == f"acp-proxy: --trace {path}: a symbolic link; give the file itself"
    assert target.read_text() == "keep me\n"


@pytest.mark.parametrize("reader", [False, True], ids=["unread", "read"])
def test_a_fifo_planted_as_the_trace_is_refused_without_blocking(
    tmp_path: Path, reader: bool
) -> None:
    """A FIFO nobody reads would block an open for writing; one that is read would take the
    trace somewhere else: both are refused at once (the run is bounded by TIMEOUT)."""
    path = tmp_path / "trace.jsonl"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK) if reader else None
    try:
        line = run(tmp_path, "--trace", str(path))
        if fd is not None:
            assert os.read(fd, 1024) == b""  # nothing was written into it
    finally:
        if fd is not None:
            os.close(fd)
    assert line == f"acp-proxy: --trace {path}: not a regular file"
    assert stat.S_ISFIFO(path.lstat().st_mode)


# -- the state file ------------------------------------------------------------------------------


def test_a_state_file_in_a_directory_that_cannot_be_written(
    tmp_path: Path, unprivileged: Preexec
) -> None:
    """Readable, but every save would fail: refused at start, not at the first save."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    path = directory / "state.json"
    path.write_text('{"version": 1}')
    directory.chmod(0o500)
    try:
        line = run(tmp_path, "--state", str(path), preexec=unprivileged)
    finally:
        directory.chmod(0o700)
    assert line == f"acp-proxy: --state {path}: cannot be written: permission denied"


def test_a_state_file_that_cannot_be_read(tmp_path: Path, unprivileged: Preexec) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"version": 1}')
    path.chmod(0o000)
    line = run(tmp_path, "--state", str(path), preexec=unprivileged)
    assert line == f"acp-proxy: --state {path}: permission denied"


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        (b"", "not a state file: invalid JSON (Expecting value: line 1 column 1 (char 0))"),
        (
            b'{"version": 1,',
            "not a state file: invalid JSON (Expecting property name enclosed in double quotes: line 1 column 15 (char 14))",
        ),
        (b'{"version": 1, "x": "\xff"}', "not a state file: not UTF-8"),
        (b"[1, 2]", "not a state file: no version"),
        (b'{"engine": {}}', "not a state file: no version"),
        (b'{"version": 2}', "a state file of version 2; this proxy reads version 1"),
        (b'{"version": "1"}', "a state file of version '1'; this proxy reads version 1"),
        (
            b'{"version": 1, "engine": []}',
            "not a state file of this proxy: engine: not an object",
        ),
        (
            b'{"version": 1, "engine": {"rng": [3, [1, 2], null]}}',
            "not a state file of this proxy: engine: state vector is the wrong size",
        ),
        (
            b'{"version": 1, "ledger": {"entries": [{"session": "s"}]}}',
            "not a state file of this proxy: ledger: missing 'key'",
        ),
    ],
    ids=[
        "empty",
        "cut",
        "not-utf8",
        "list",
        "no-version",
        "version-2",
        "version-text",
        "engine-list",
        "bad-rng",
        "bad-ledger",
    ],
)
def test_a_corrupt_state_file(tmp_path: Path, content: bytes, cause: str) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    line = run(tmp_path, "--state", str(path))
    assert line.startswith(f"acp-proxy: --state {path}: {cause}"), line
    assert path.read_bytes() == content  # left as it was


def test_a_run_that_cannot_start_writes_no_trace(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text('{"version": 2}')
    trace = tmp_path / "trace.jsonl"
    run(tmp_path, "--state", str(state), "--trace", str(trace))
    assert not trace.exists()


def test_a_good_state_file_still_starts(tmp_path: Path) -> None:
    """The checks refuse nothing a proxy wrote itself: a saved state is taken back."""
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"version": 1, "engine": {"rules": {}}, "ledger": {}}))
    agent = [sys.executable, "-c", "print('bye')"]
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "run", "--state", str(path), "--", *agent],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(path.read_text())["version"] == 1


# -- a directory the other commands write into -------------------------------------------------


AGENT = [sys.executable, "-m", "proxy", "agent"]


@pytest.mark.parametrize(
    ("command", "exit_status", "said"),
    [
        (
            ["agent", "--listen", "ws://127.0.0.1:0/acp", "--store", "{dir}"],
            1,
            "acp-proxy agent: --store {dir}: cannot be written: permission denied",
        ),
        (
            ["demo", "--keep", "{dir}"],
            2,
            "error: --keep {dir}: cannot be written: permission denied",
        ),
        (
            ["check-agent", "--junit", "{dir}/results.xml", "--", *AGENT],
            2,
            "error: --junit {dir}/results.xml: cannot be written: permission denied",
        ),
    ],
    ids=["agent-store", "demo-keep", "check-agent-junit"],
)
def test_an_existing_directory_that_cannot_be_written(
    tmp_path: Path, unprivileged: Preexec, command: list[str], exit_status: int, said: str
) -> None:
    """A folder that is there but not writable (a container's volume owned by another user) is
    refused as the command starts, in one line: the reference Agent once started, and ended its
    first session with a traceback; check-agent ran every trace, then died writing its JUnit."""
    directory = tmp_path / "volume" / "sessions"
    directory.mkdir(parents=True)
    directory.chmod(0o500)
    arguments = [word.replace("{dir}", str(directory)) for word in command]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "proxy", *arguments],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT,
            check=False,
            preexec_fn=unprivileged,
        )
    finally:
        directory.chmod(0o700)
    stderr = done.stderr.decode()
    assert done.returncode == exit_status, stderr
    assert done.stdout == b""
    assert stderr == said.replace("{dir}", str(directory)) + "\n"
    assert list(directory.iterdir()) == []


def test_cannot_write_in_asks_the_file_system(tmp_path: Path) -> None:
    """None where a file can be made (and none is left behind); the cause where it cannot."""
    directory = tmp_path / "dir"
    assert cannot_write_in(directory) == "no such file or directory"
    directory.mkdir()
    assert cannot_write_in(directory) is None
    assert list(directory.iterdir()) == []
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert cannot_write_in(a_file) == "not a directory"
