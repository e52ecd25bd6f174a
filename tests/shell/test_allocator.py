"""``acp-proxy run`` fixes glibc's allocator thresholds: a 64 KiB message read at once no longer
maps and faults in fresh pages (a real proxy process, its pipes enlarged, its page faults read
from /proc), and a threshold the environment sets is kept."""

from __future__ import annotations

import fcntl
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.shell.allocator import tune_allocator

glibc_only = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's allocator"
)

F_SETPIPE_SZ = 1031


@glibc_only
def test_the_thresholds_are_set_unless_the_environment_sets_them() -> None:
    code = "from proxy.shell.allocator import tune_allocator; print(tune_allocator({}))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "set"
    assert tune_allocator({"MALLOC_TRIM_THRESHOLD_": "131072"}) == "kept"
    assert tune_allocator({"MALLOC_MMAP_THRESHOLD_": "131072"}) == "kept"
    assert tune_allocator({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) == "kept"


ALLOCATIONS = """
import ctypes, sys
from proxy.shell.allocator import tune_allocator

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
if sys.argv[1] == "tuned":
    assert tune_allocator({}) == "set"
mapped = libc.mallinfo2().hblkhd
large = bytearray(512 * 1024)
mapped = libc.mallinfo2().hblkhd - mapped
pieces = [bytearray(64 * 1024) for _ in range(96)]
heap = libc.mallinfo2().arena
del pieces
kept = libc.mallinfo2().arena
print(mapped, heap - kept)
"""


@glibc_only
@pytest.mark.parametrize("tuned", [True, False])
def test_buffers_under_a_mib_come_from_a_heap_that_is_not_handed_back(tuned: bool) -> None:
    """Tuned, a 512 KiB buffer is not mapped on its own, and 6 MiB freed at the top of the heap
    stay in it; glibc's own thresholds (the control) map the one and hand the other back."""
    done = subprocess.run(
        [sys.executable, "-c", ALLOCATIONS, "tuned" if tuned else "glibc"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))},
    )
    mapped, handed_back = map(int, done.stdout.split())
    if tuned:
        assert (mapped, handed_back) == (0, 0)
    else:
        assert mapped >= 512 * 1024
        assert handed_back >= 4 * 1024 * 1024


def minor_faults(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])


@glibc_only
def test_a_large_message_read_at_once_faults_in_no_fresh_pages() -> None:
    """Each 64 KiB prompt reaches the proxy in one read (its stdin holds 1 MiB): left to glibc's
    own thresholds, each mapped and faulted in about 67 pages in some builds (the heap's layout
    decides: the test above is the one that tells the thresholds apart)."""
    agent = [sys.executable, "-m", "proxy.tools.bench.agent"]
    proxy = subprocess.Popen(
        [sys.executable, "-m", "proxy", "run", "--log-level", "warning", "--", *agent],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))},
    )
    assert proxy.stdin is not None
    assert proxy.stdout is not None
    fcntl.fcntl(proxy.stdin.fileno(), F_SETPIPE_SZ, 1 << 20)
    fcntl.fcntl(proxy.stdout.fileno(), F_SETPIPE_SZ, 1 << 20)
    params = {"sessionId": "S", "prompt": [{"type": "text", "text": "x" * 65536}]}

    def prompt(request_id: int) -> None:
        message = {"jsonrpc": "2.0", "id": request_id, "method": "session/prompt"}
        assert proxy.stdin is not None
        assert proxy.stdout is not None
        proxy.stdin.write(json.dumps({**message, "params": params}).encode() + b"\n")
        proxy.stdin.flush()
        answer = json.loads(proxy.stdout.readline())
        assert answer["id"] == request_id

    try:
        for request_id in range(20):  # the heap grows to what a message needs
            prompt(request_id)
        before = minor_faults(proxy.pid)
        for request_id in range(20, 220):
            prompt(request_id)
        faults = minor_faults(proxy.pid) - before
    finally:
        proxy.stdin.close()
        proxy.wait(timeout=60)
        proxy.stdout.close()
    assert faults < 2 * 200, f"{faults / 200:.1f} page faults a message"
