"""On real descriptors: ``write_all`` goes on after a short write and says when a write fails;
``widen_pipe`` widens a pipe, never narrows one, and leaves what is not a pipe alone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from proxy.shell.descriptors import pipe_size, widen_pipe, write_all


def test_everything_reaches_a_pipe_read_slowly() -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: sixteen times what the pipe holds
    read_end, write_end = os.pipe()
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(read_end, 1000):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        write_all(write_end, data)
    finally:
        os.close(write_end)
        reader.join()
        os.close(read_end)
    assert received == data


def test_a_short_write_is_followed_by_the_next_and_its_failure_raises(tmp_path: Path) -> None:
    """Past a file size limit the kernel writes what fits (a short write), then refuses: the
    loop writes again, and the refusal is an :class:`OSError` the caller sees."""
    target = tmp_path / "limited"
    script = textwrap.dedent(
        f"""
        import errno, os, resource, signal
        from proxy.shell.descriptors import pipe_size, widen_pipe, write_all
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        fd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)
        write_all(fd, b"a" * 60_000)
        try:
            write_all(fd, b"b" * 60_000)
        except OSError as exc:
            print(errno.errorcode[exc.errno])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "EFBIG"
    assert target.read_bytes() == b"a" * 60_000 + b"b" * 40_000


def test_a_pipe_is_widened_and_never_narrowed() -> None:
    read_end, write_end = os.pipe()
    try:
        made = pipe_size(read_end)
        assert made is not None
        assert widen_pipe(write_end, 4 * made) == 4 * made
        assert pipe_size(read_end) == 4 * made  # one pipe, whichever end asked
        assert widen_pipe(read_end, made) == 4 * made
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_file_or_a_socket_is_not_a_pipe(tmp_path: Path) -> None:
    left, right = socket.socketpair()
    with left, right, (tmp_path / "file").open("wb") as file:
        assert widen_pipe(file.fileno(), 1 << 20) is None
        assert widen_pipe(left.fileno(), 1 << 20) is None


def run_as_nobody(body: str) -> subprocess.CompletedProcess[str]:
    """``body`` run by Python as ``nobody`` (from root; as whoever runs the tests otherwise),
    with ``os``, ``pipe_size`` and ``widen_pipe`` imported: a user without ``CAP_SYS_RESOURCE``,
    whose pipe budget the test may use up in a process of its own."""
    script = (
        "import os\n"
        "from proxy.shell.descriptors import pipe_size, widen_pipe\n"
        "if os.getuid() == 0:\n"
        "    os.setgid(65534)\n"
        "    os.setuid(65534)\n"
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )


def test_a_pipe_asked_past_what_the_system_allows_gets_its_most() -> None:
    """Past ``pipe-max-size`` a process without ``CAP_SYS_RESOURCE`` is refused (``EPERM``): the
    pipe gets ``pipe-max-size`` instead."""
    done = run_as_nobody(
        """
        most = int(open("/proc/sys/fs/pipe-max-size").read())
        read_end, _ = os.pipe()
        print(most, widen_pipe(read_end, 2 * most), pipe_size(read_end))
        """
    )
    assert done.returncode == 0, done.stderr
    most, widened, after = done.stdout.split()
    assert most == widened == after


def test_a_user_past_their_pipe_budget_keeps_the_pipes_as_made() -> None:
    """Once a user's pipes hold ``pipe-user-pages-soft`` in all, the kernel widens none of
    theirs (``EPERM``, ``pipe-max-size`` too): the pipe keeps what it holds, and nothing fails."""
    done = run_as_nobody(
        """
        if int(open("/proc/sys/fs/pipe-user-pages-soft").read()) == 0:
            raise SystemExit("no budget")
        for _ in range(10_000):
            read_end, _write_end = os.pipe()
            made = pipe_size(read_end)
            widened = widen_pipe(read_end, 1 << 20)
            if widened != 1 << 20:
                print(made, widened, pipe_size(read_end))
                break
        """
    )
    if done.stderr.strip().endswith("no budget"):
        pytest.skip("this system sets no pipe budget (pipe-user-pages-soft is 0)")
    assert done.returncode == 0, done.stderr
    made, widened, after = done.stdout.split()
    assert made == widened == after
