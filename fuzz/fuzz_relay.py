"""Fuzz the relay core (proxy/core/relay.py) with the observers of a run, driven by both peers.

An input is a script, one step per line (see :func:`invariants.read_script`; seeds in
``fuzz/corpus/relay/``): messages and arbitrary bytes from the Client and the Agent, answers to
the requests each got, cancels, oversize reports, timers and hang-ups, with or without the fault
rules of every action. Invariants: :func:`invariants.check_relay` (nothing raises; a forwarded
message differs from what arrived only in its id; the proxy answers a peer only with errors; a
request and its answer still cross the link both ways afterwards).
"""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["proxy"]):
    import invariants

    from proxy.shell.log import configure_logging

from target import run


def test_one_input(data: bytes) -> None:
    """Run the script, then probe the link."""
    invariants.check_relay(invariants.read_script(data))


if __name__ == "__main__":
    configure_logging("json", "debug")  # the JSON renderer, fed every observation
    run(test_one_input, "relay")
