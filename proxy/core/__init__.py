"""The sans-I/O core: what the proxy does with messages, as pure code (DESIGN 12).

Events in, commands out. :mod:`~proxy.core.relay` is where a message goes: one link's state
machine takes :mod:`~proxy.core.events` (a message received, a peer gone, a timer fired) and
returns :mod:`~proxy.core.commands` (send these bytes, close that peer, start a timer) and
observations (what happened, for metrics, logs, the trace and the ledger). Around it:

* messages as the relay sees them: :mod:`~proxy.core.jsonrpc` (classification, ids kept as
  bytes), :mod:`~proxy.core.splice` (ids spliced into the original bytes), and the framings
  :mod:`~proxy.core.framing` (lines) and :mod:`~proxy.core.sse` (server-sent events);
* :mod:`~proxy.core.idmap`: the requests pending each way and the ids minted for them;
* :mod:`~proxy.core.invalid`: what the relay does with invalid input (forwarded, answered,
  refused);
* faults: :mod:`~proxy.core.faultfile` (the fault file's models) and :mod:`~proxy.core.engine`
  (which rules fire for a message);
* :mod:`~proxy.core.ledger`: what the proxy judges of keyed prompts (the RFD's findings).

Rules: nothing here imports asyncio, sockets, a clock, logging or a metrics library; time and
randomness are passed in. ``tests/test_layering.py`` enforces it.
"""
