"""The programs built on the proxy: each a command of ``acp-proxy``, imported when it runs.

* :mod:`~proxy.tools.lab`: the retry lab: the reference Agent and Client, and the demo;
* :mod:`~proxy.tools.check_agent`: the RFD's conformance traces against any Agent;
* :mod:`~proxy.tools.report`: what a run showed, read back from its traces (text, JSON, HTML);
* :mod:`~proxy.tools.bench`: the proxy's cost, measured against the floor of any Python relay;
* :mod:`~proxy.tools.verdicts`: the checkers' verdicts and how they are told;
* :mod:`~proxy.tools.rpc`: the one JSON-RPC client the tools talk to Agents with.

Each command's entry takes the options' model of its tool (built and checked from the command
line's values: an invalid one is an :class:`~proxy.core.errors.OptionError`), prints what it has
to say, and returns the exit status.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

__all__ = ["cannot_run"]


def cannot_run(agent_argv: Sequence[str], what: str = "Agent") -> str | None:
    """Why the command ``agent_argv`` (of the Agent, or ``what``) cannot be run (its program is
    not an executable), as the text of an ``error: ...`` line; None when it can be."""
    if shutil.which(agent_argv[0]) is None:
        return f"cannot run the {what}: {agent_argv[0]!r} is not an executable"
    return None
