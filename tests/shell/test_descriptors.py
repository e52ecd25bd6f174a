"""``write_all`` goes on after a short write, and says when a write fails, on real descriptors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from proxy.shell.descriptors import write_all


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
        from proxy.shell.descriptors import write_all
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
