"""``acp-proxy check-client``: the idempotency RFD's rules for Clients, checked on any Client.

The Client under test is run once per fault setup, in front of an Agent the checker controls: the
proxy (with the setup's fault file and ``--trace``) in front of the reference Agent (with a store,
so that it keeps its sessions across restarts). Its command names that Agent with ``{agent}``,
``{agent-json}`` or, with ``--listen``, ``{url}`` (:func:`~.agent.expand`); it is expected to
send its prompts on its own (a CLI Client given one on its command line). Each run is bounded in
time (``--client-timeout``) and its process group always reaped. Then each scenario (C0-C7) is
judged from what the proxy saw (the trace, the ledger's findings in it): PASS, FAIL with the
evidence, SKIP with the reason (every one for a v1 Client: the reference Agent's store says which
version ``initialize`` agreed on), ERROR when the run could not be carried out.

The package, one concern a module:

* :mod:`.options`: :class:`ClientCheckOptions`;
* :mod:`.agent`: the Agent the checker controls for one run, and the Client's command with it;
* :mod:`.run`: one run of the Client, bounded and reaped; :mod:`.observed`: what its trace shows;
* :mod:`.scenarios`: C0-C7 and the setups of their runs (:data:`SCENARIOS`, :data:`SETUPS`);
* :mod:`.runner`: :func:`check_client`, the runs done and every scenario turned into a result;
* :mod:`.command`: :func:`check_client_main`, the command's entry (the output is the checkers'
  shared :mod:`proxy.tools.verdicts`).
"""

from proxy.tools.check_client.command import check_client_main
from proxy.tools.check_client.options import ClientCheckOptions
from proxy.tools.check_client.runner import check_client
from proxy.tools.check_client.scenarios import SCENARIOS

__all__ = ["SCENARIOS", "ClientCheckOptions", "check_client", "check_client_main"]
