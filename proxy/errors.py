"""The proxy's own exceptions: a small tree, for errors of ours or of our configuration.

What a peer sends wrong is never an exception: it is an observation (see :mod:`proxy.commands`).
"""

from __future__ import annotations

__all__ = ["ConfigError", "ProxyError"]


class ProxyError(Exception):
    """Root of the proxy's exceptions."""


class ConfigError(ProxyError):
    """A fault file, an option or a control-API request is invalid; the message says where."""
