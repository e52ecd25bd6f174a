"""``acp-proxy check-agent``: the idempotency RFD's conformance traces, run against any Agent.

Each trace (T0-T7 of the wire brief, section 5) starts the proxy in front of the Agent with a fault
file of its own, talks to it as a Client over ``--transport`` (stdio, ws or http: the transport
between this checker and the proxy; the proxy always spawns the Agent over stdio), provokes the
loss the trace is about, and judges what came back: PASS, FAIL with the reason, SKIP with the
missing capability, or ERROR when the check could not be carried out. Every submission has a fresh
UUID key, and every trace checks that none of its keys appears in what the Agent sends. A just
started Agent gets ``startup_timeout`` to answer ``initialize``; a connection that closes early
is explained from the proxy's log (kept in the trace's directory, never shown as is).

T0 invalid keys are ``-32602`` and insert nothing. T1 a retry on the same connection after a lost
answer gets the original ``messageId``. T2 the same after reconnecting and ``session/resume`` (the
proxy keeps the Agent for the next connection: conductor mode). T3 the same after the Agent was
killed and restarted (needs an Agent that stores its sessions). T4 a retry of a held prompt is
answered with it; ``$/cancel_request`` of one answers both ``-32800``. T5 after an error the key is
unused. T6 a key is scoped to its session. T7 a retry of a prompt inserted during active work.

The package, one concern a module:

* :mod:`.options`: :class:`CheckOptions` (a trace's result and the exceptions that decide it
  are the checkers' shared :mod:`proxy.tools.verdicts`);
* :mod:`.conversation`: one Client connection (the tools' JSON-RPC client,
  :mod:`proxy.tools.rpc`) and what the traces read in its messages;
* :mod:`.lab`: the proxy in front of the Agent for one trace, its logs and their diagnosis;
* :mod:`.steps`: the steps the traces share; :mod:`.traces`: T0-T7, grouped by what they are
  about, in one table (:data:`TRACES`);
* :mod:`.runner`: :func:`check_agent`, every trace turned into a result;
* :mod:`.output`: the table, JSON, JUnit XML and the exit status (through
  :mod:`proxy.tools.verdicts`);
* :mod:`.command`: :func:`check_agent_main`, the command's entry.
"""

from proxy.tools.check_agent.command import check_agent_main
from proxy.tools.check_agent.options import CheckOptions
from proxy.tools.check_agent.output import exit_status, render, to_json, to_junit
from proxy.tools.check_agent.runner import check_agent
from proxy.tools.check_agent.traces import TRACES
from proxy.tools.verdicts import Result, Status

__all__ = [
    "TRACES",
    "CheckOptions",
    "Result",
    "Status",
    "check_agent",
    "check_agent_main",
    "exit_status",
    "render",
    "to_json",
    "to_junit",
]
