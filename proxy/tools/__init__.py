"""The programs built on the proxy: each a command of ``acp-proxy``, imported when it runs.

* :mod:`~proxy.tools.lab`: the retry lab: the reference Agent and Client, and the demo;
* :mod:`~proxy.tools.check_agent`: the RFD's conformance traces against any Agent;
* :mod:`~proxy.tools.report`: what a run showed, read back from its traces (text, JSON, HTML);
* :mod:`~proxy.tools.bench`: the proxy's cost, measured against the floor of any Python relay;
* :mod:`~proxy.tools.rpc`: the one JSON-RPC client the tools talk to Agents with.
"""
