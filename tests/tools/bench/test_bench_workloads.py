"""The workloads through every target (``proxy.tools.bench.workloads``), in the short bench's
report: every figure present, and every relay compared to ``direct``.

No figure is compared to a limit here: timings belong to the bench's own report (DESIGN 11), never
to a test's verdict.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pytest
from tool_runs import BENCH_TEST_TIMEOUT, positive, short_bench
from websockets.client import ClientProtocol
from websockets.frames import Frame
from websockets.protocol import State
from websockets.uri import parse_uri

from proxy import compiled_modules, core_build
from proxy.shell.allocator import MMAP_THRESHOLD, TRIM_THRESHOLD
from proxy.tools.bench import TARGETS, WORKLOADS
from proxy.tools.bench.messages import text_frame, update_frames, update_line, updates
from proxy.tools.bench.run import _allocator_fixed
from proxy.tools.bench.ws_targets import WS_TARGETS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BENCH_TEST_TIMEOUT)]


@pytest.mark.parametrize("transport", ["stdio", "websocket"])
def test_every_target_and_workload_is_reported(transport: str) -> None:
    """Over stdio and over WebSocket, every target but an absent external relay (socat,
    mitmproxy) is measured, and the pure build beside the compiled one when the core is
    compiled; each says why when absent."""
    report = short_bench()
    assert report["mode"] == "short"
    assert report["errors"] == {}
    section = report if transport == "stdio" else report["websocket"]
    names, external = (TARGETS, "socat") if transport == "stdio" else (WS_TARGETS, "mitmproxy")
    assert set(section["targets"]) == set(names)
    executable = "socat" if transport == "stdio" else "mitmdump"
    present = shutil.which(executable) is not None
    assert report["core"] == {"build": core_build(), "compiled": compiled_modules()}
    for name, target in section["targets"].items():
        if name == external and not present:
            assert target["available"] is False
            assert f"{executable} not found on PATH" in target["reason"]
            assert "workloads" not in target
            continue
        if name == "proxy-pure" and not report["core"]["compiled"]:
            assert target["available"] is False
            assert "the core is pure Python" in target["reason"]
            continue
        assert target["available"] is True, name
        assert set(target["workloads"]) == set(WORKLOADS), name
        assert positive(target["peak_rss_kib"]), name
        ping, stream, prompt = (target["workloads"][w] for w in ("ping", "stream", "prompt64k"))
        for latency in (ping, prompt):
            for key in ("p50_ms", "p99_ms", "mean_ms", "per_second"):
                assert positive(latency[key]), (name, key)
            assert latency["p50_ms"] <= latency["p99_ms"]
        assert ping["count"] == report["config"]["requests"] * report["config"]["rounds"]
        assert prompt["count"] == report["config"]["prompts"] * report["config"]["rounds"]
        assert positive(prompt["mib_per_second"])
        assert stream["count"] == report["config"]["notifications"] * report["config"]["rounds"]
        assert positive(stream["seconds"])
        assert positive(stream["per_second"])


def test_every_relay_is_compared_to_direct() -> None:
    """Added latency may be negative (noise in a short run), but it is a finite number."""
    report = short_bench()
    relays = [t for t in TARGETS if t != "direct" and report["targets"][t]["available"]]
    assert "proxy" in relays
    assert "proxy+rules" in relays
    websocket = report["websocket"]
    ws_relays = [t for t in WS_TARGETS if t != "direct" and websocket["targets"][t]["available"]]
    assert {"websockets", "proxy"} <= set(ws_relays)
    for target in ws_relays:
        assert set(websocket["comparisons"][target]) >= {"direct"} | ({"websockets"} - {target})
    compared = [(report["comparisons"], t) for t in relays]
    compared += [(websocket["comparisons"], t) for t in ws_relays]
    for comparisons, target in compared:
        versus = comparisons[target]["direct"]
        for workload in ("ping", "prompt64k"):
            for key in ("added_p50_ms", "added_p99_ms"):
                assert math.isfinite(versus[workload][key])
            assert positive(versus[workload]["p50_ratio"])
        assert positive(versus["stream"]["throughput_ratio"])
    for target in relays:
        if target != "socat":
            socat = report["targets"]["socat"]["available"]
            assert ("socat" in report["comparisons"][target]) == socat


def test_with_fixed_allocator_every_process_runs_with_the_proxys_thresholds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--fixed-allocator``: the floors run on the allocator the proxy runs on (glibc's moving
    thresholds made the asyncio relay's figures change from one run to the next), unless the
    environment sets the thresholds; the bench's own environment is given back after. Without
    it, every process runs with glibc's own."""
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    fixed = {
        "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
        "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
    }
    show = "import os; print(os.environ['MALLOC_MMAP_THRESHOLD_'], os.environ['MALLOC_TRIM_THRESHOLD_'])"
    with _allocator_fixed() as allocator:
        inherited = subprocess.run(
            [sys.executable, "-c", show], capture_output=True, text=True, check=True, timeout=60
        ).stdout.split()
    assert allocator == fixed
    assert inherited == list(fixed.values())
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    with _allocator_fixed() as allocator:
        assert "MALLOC_MMAP_THRESHOLD_" not in os.environ
    assert allocator == {"MALLOC_MMAP_THRESHOLD_": "glibc's", "MALLOC_TRIM_THRESHOLD_": "131072"}
    assert short_bench()["config"]["allocator"] is None


@pytest.mark.parametrize("count", [0, 1, 999, 1000, 1001, 20_345])
def test_a_stream_is_the_numbered_notifications_in_one_block(count: int) -> None:
    """The stdio Agent writes a stream as one block: ``count`` notifications, one a line,
    numbered from 0 and again from 0 after each thousand."""
    block = updates(count)
    lines = block.splitlines(keepends=True)
    assert len(lines) == count
    assert lines == [update_line(seq % 1000) for seq in range(count)]


def _server_frames(data: bytes) -> list[tuple[str, bool, bytes]]:
    """``data`` parsed by ``websockets``' own Client protocol: each frame's opcode, fin, payload."""
    protocol = ClientProtocol(parse_uri("ws://127.0.0.1/acp"), state=State.OPEN, max_size=None)
    protocol.receive_data(data)
    frames = protocol.events_received()
    assert all(isinstance(frame, Frame) for frame in frames)
    return [(frame.opcode.name, frame.fin, bytes(frame.data)) for frame in frames]  # type: ignore[union-attr]


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 200_000])
def test_a_text_frame_is_what_websockets_parses(size: int) -> None:
    """Each of the three lengths of RFC 6455 5.2 (7 bits, 16, 64), at its edges."""
    payload = b"x" * size
    assert _server_frames(text_frame(payload)) == [("TEXT", True, payload)]


@pytest.mark.parametrize("count", [0, 1, 1001])
def test_a_websocket_stream_is_the_numbered_notifications_framed_in_one_block(count: int) -> None:
    """The WebSocket Agent's stream: the stdio one's notifications, each a text frame."""
    frames = _server_frames(update_frames(count))
    assert frames == [("TEXT", True, update_line(seq % 1000)[:-1]) for seq in range(count)]
