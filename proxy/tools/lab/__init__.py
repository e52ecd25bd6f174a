"""The retry lab: the reference v2 Agent (:mod:`~proxy.tools.lab.agent`) and Client
(:mod:`~proxy.tools.lab.client`), and the demo that runs them through the proxy with faults
(:mod:`~proxy.tools.lab.demo`)."""
