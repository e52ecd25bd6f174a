"""``acp-proxy replay``: a recorded session (``acp-proxy run --record FILE``) played again.

* :mod:`~proxy.tools.replay.files` reads a recording file (plain or gzip), bounded, checked;
* :mod:`~proxy.tools.replay.agent`, ``replay agent FILE``: an Agent that answers as the recorded
  one did (the matching and the mapping of ids: :mod:`proxy.core.replay`);
* :mod:`~proxy.tools.replay.client`, ``replay client FILE -- AGENT_CMD``: the recorded Client's
  messages sent to a live Agent, and where its answers differ from the recorded ones.
"""
