"""HOST:PORT as the options take it and URLs write it: an IPv6 address in brackets (``[::1]:0``)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from proxy.core.errors import ConfigError

__all__ = ["authority", "parse_host_port", "url_scheme"]


def authority(host: str, port: int) -> str:
    """``HOST:PORT`` as a URL writes it (``[::1]:9090``, ``127.0.0.1:9090``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_scheme(scheme: Literal["http", "ws"], *, secure: bool) -> str:
    """The scheme a URL writes for a transport: ``http``, ``ws``, or ``https``, ``wss`` in TLS."""
    return f"{scheme}s" if secure else scheme


def parse_host_port(text: str, *, option: str) -> tuple[str, int]:
    """The host (brackets of an IPv6 address removed) and port of ``HOST:PORT``."""
    try:
        parts = urlsplit(f"//{text}")
        host, port = parts.hostname, parts.port
    except ValueError:  # an unclosed '[', a port that is no number or beyond 65535
        host = port = None
    # Written back, it must read as given: no "[::1]x:0", "a b:80", "[v1.x]:80" or "::1:0".
    if not host or port is None or authority(host, port) != text or " " in text:
        raise ConfigError(
            f"{option}: expected HOST:PORT (an IPv6 address in brackets: [::1]:PORT), got {text!r}"
        )
    return host, port
