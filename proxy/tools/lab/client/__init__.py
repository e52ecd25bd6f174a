"""``acp-proxy client``: a small ACP v2 Client that retries prompts safely with idempotency keys.

It is the Client side of the retry lab (DESIGN 8, issue 6), written to the idempotency RFD:

* One key per submission: a UUID4 made when the input is submitted, not when a request is
  written, and kept with the pending input until an answer confirms it. Every attempt is its own
  JSON-RPC request with a new ``id`` and the same ``idempotencyKey``.
* No answer within ``answer_timeout``: the outcome is unknown, so the prompt is sent again with
  the same key on the same connection (trace T1); a late answer to an earlier attempt still
  confirms the submission. With ``follow_trace`` (the trace of the proxy in front of the Agent,
  :mod:`proxy.tools.lab.trace_follow`) an answer the proxy lost times out at once, and the timer
  is left for answers that are really late: what a run shows does not depend on the machine's
  speed (``acp-proxy demo`` runs the Client so).
* The connection fails (stdout EOF when the spawned command exits, the WebSocket closes, the HTTP
  connection stream ends): the Client connects again (respawning a stdio command), sends
  ``initialize`` and ``session/resume`` with ``replayFrom: {"type": "start"}``, collects the
  replayed user messages, and resends the pending prompt with the same key (traces T2, T3).
* An error answer means the message was not inserted and the key is still unused: the prompt is
  resent with the same key, up to ``max_attempts``. ``-32600`` or ``-32002`` mean the Agent no
  longer knows this connection or session (an Agent restarted behind a proxy that kept the pipe):
  the Client first initializes and resumes again on the same connection.
* At the end the session is resumed once more with a full replay (the history the report
  shows); with ``follow_trace``, once the proxy has nothing held for the Agent or outstanding
  there (a copy it injected has been answered), so that history is final. The verdict counts
  every ``user_message`` seen for a submission: live during a turn and replayed by any
  ``session/resume``, on every connection, and the ``messageId`` s its attempts were answered
  with. A submission with more than one distinct ``messageId`` was
  inserted more than once (the RFD's invariant is one), as the proxy's ledger judges
  ``duplicate_insert``: an Agent's replay that leaves a copy out hides nothing.

:func:`run_client` returns a :class:`ClientReport` (``to_json()`` for machines, :func:`render`
for people, :attr:`ClientReport.exit_status` for the command). Logs go to stderr through
:mod:`proxy.shell.log`; nothing is printed but by :func:`client_main`, the command's entry.

The package, one concern a module:

* :mod:`.options`: :class:`ClientOptions`;
* :mod:`.connection`: how the Agent is reached (stdio, WebSocket, Streamable HTTP, through the
  tools' JSON-RPC client :mod:`proxy.tools.rpc`) and one connection's replay state;
* :mod:`.session`: connecting, initializing, creating, resuming and verifying the session;
* :mod:`.retry`: delivering one submission, resending with its key until it is confirmed;
* :mod:`.run`: :func:`run_client`, one run;
* :mod:`.report`: the report's records and :func:`judge`, the verdict;
* :mod:`.render`: the report for people;
* :mod:`.command`: :func:`client_main`, the command's entry.
"""

from __future__ import annotations

from proxy.tools.lab.client.command import client_main
from proxy.tools.lab.client.options import ClientOptions
from proxy.tools.lab.client.render import render
from proxy.tools.lab.client.report import (
    Attempt,
    ClientReport,
    Resume,
    SeenMessage,
    Submission,
    judge,
)
from proxy.tools.lab.client.run import run_client

__all__ = [
    "Attempt",
    "ClientOptions",
    "ClientReport",
    "Resume",
    "SeenMessage",
    "Submission",
    "client_main",
    "judge",
    "render",
    "run_client",
]
