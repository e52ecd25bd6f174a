"""The asyncio shell: the I/O around the core (DESIGN 12).

* :mod:`~proxy.shell.link`: one link, Client to Agent: reads both peers, feeds the relay core,
  carries out its commands (the one interpreter of :mod:`proxy.core.commands`);
* :mod:`~proxy.shell.endpoint` and :mod:`~proxy.shell.transports`: a connection to one peer, over
  stdio, Streamable HTTP or WebSocket;
* :mod:`~proxy.shell.server` (a listener, one link per Client) and :mod:`~proxy.shell.app` (the
  composition root: a run wired from its options);
* :mod:`~proxy.shell.admin` (the control API) and :mod:`~proxy.shell.origin_policy`;
* what is observed: :mod:`~proxy.shell.metrics`, :mod:`~proxy.shell.observers`,
  :mod:`~proxy.shell.trace`, :mod:`~proxy.shell.log`;
* :mod:`~proxy.shell.watch` (fault files reloaded) and :mod:`~proxy.shell.state` (persistence).

The shell imports the core, never the tools.
"""
