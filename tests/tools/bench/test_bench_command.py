"""``acp-proxy bench``'s entry (``proxy.tools.bench.command``): counts are checked, columns left
out."""

from __future__ import annotations

import pytest
from tool_runs import BENCH_TEST_TIMEOUT, bench

from proxy.shell.allocator import MMAP_THRESHOLD, TRIM_THRESHOLD
from proxy.tools.bench import make_options


def test_counts_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="--requests"):
        make_options(requests=0)
    with pytest.raises(ValueError, match="--memory-check"):
        make_options(memory_check=-1)
    with pytest.raises(ValueError, match="--ws-links"):
        make_options(ws_links=-1)
    with pytest.raises(ValueError, match="--delays"):
        make_options(delays=-1)
    assert (make_options(ws_links=0).ws_links, make_options(delays=0).delays) == (0, 0)
    short = make_options(short=True, prompts=3, socat=False)
    assert (short.short, short.prompts, short.socat) == (True, 3, None)


def test_the_websocket_columns_can_be_left_out() -> None:
    """``--no-websocket`` leaves out every WebSocket column, mitmproxy's with them;
    ``--no-mitmproxy`` only mitmproxy's."""
    assert make_options().websocket is True
    left_out = make_options(websocket=False)
    assert (left_out.websocket, left_out.mitmdump) == (False, None)
    assert make_options(mitmproxy=False).mitmdump is None


@pytest.mark.slow
@pytest.mark.timeout(BENCH_TEST_TIMEOUT)
def test_fixed_allocator_is_asked_for_and_said_in_the_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--fixed-allocator``: the report says which thresholds every process ran with."""
    assert make_options().fixed_allocator is False
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    report = bench(
        "--fixed-allocator", "--no-websocket", "--no-socat", "--ws-links", "0", "--delays", "0"
    )
    assert report["config"]["allocator"] == {
        "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
        "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
    }
    assert report["errors"] == {}
