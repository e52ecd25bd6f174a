"""The Host and Origin policy on its own (no sockets): which header values each bind admits.

The servers' use of it, over real loopback requests, is tested in ``test_control.py`` (the control
API) and ``test_http_listener.py`` (the listener and its WebSocket upgrade).
"""

from __future__ import annotations

import pytest

from proxy.core.errors import ConfigError
from proxy.shell.origin_policy import (
    Allowances,
    OriginPolicy,
    parse_allowed_host,
    parse_allowed_origin,
)

PORT = 8123


def host_refused(policy: OriginPolicy, host: str | None) -> bool:
    refusal = policy.refusal(host, None)
    return refusal is not None and refusal[0] == "host"


@pytest.mark.parametrize("bind", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_a_loopback_bind_answers_to_its_loopback_names_on_any_port(bind: str) -> None:
    """localhost, 127.0.0.1, [::1] and the bind host itself; nothing else. Any port: a tunnel or
    a relay (ssh -L, kubectl port-forward) changes the one the Client uses."""
    policy = OriginPolicy("listener", bind)
    literal = f"[{bind}]" if ":" in bind else bind
    for host in (
        f"localhost:{PORT}",
        f"LOCALHOST:{PORT}",
        f"localhost.:{PORT}",
        f"127.0.0.1:{PORT}",
        f"[::1]:{PORT}",
        f"[0:0:0:0:0:0:0:1]:{PORT}",
        f"{literal}:{PORT}",
        f"localhost:{PORT + 1}",
        "localhost",
        "127.0.0.1:1",
    ):
        assert not host_refused(policy, host), host
    refused: tuple[str | None, ...] = (
        f"evil.example:{PORT}",  # DNS rebinding: the page's own name
        f"localhost.evil.example:{PORT}",
        f"127.0.0.1.evil.example:{PORT}",
        f"192.0.2.7:{PORT}",
        f"user@localhost:{PORT}",
        f"localhost:{PORT}/path",
        f"localhost:{PORT}:{PORT}",
        f"[::1:{PORT}",
        f"[nonsense]:{PORT}",
        "localhost:99999",
        "",
        None,
    )
    for refused_host in refused:
        assert host_refused(policy, refused_host), refused_host


def test_a_named_or_routable_bind_answers_to_that_name_only() -> None:
    """A bind to a name or a non-loopback address: that name, the bound port."""
    named = OriginPolicy("listener", "proxy.lan")
    assert not host_refused(named, f"proxy.lan:{PORT}")
    assert not host_refused(named, f"Proxy.LAN:{PORT}")
    assert host_refused(named, f"localhost:{PORT}")
    routable = OriginPolicy("listener", "192.0.2.7")
    assert not host_refused(routable, f"192.0.2.7:{PORT}")
    assert host_refused(routable, f"127.0.0.1:{PORT}")


@pytest.mark.parametrize("bind", ["0.0.0.0", "::"])
def test_a_wildcard_bind_answers_to_any_address_and_localhost_on_any_port(bind: str) -> None:
    """Behind a port mapping the Client's port differs; an IP address cannot be rebound."""
    policy = OriginPolicy("admin", bind)
    for host in ("127.0.0.1:8001", "172.17.0.2:9090", "[fe80::1]:1", "localhost:5", "10.0.0.1"):
        assert not host_refused(policy, host), host
    for host in ("proxy:9090", "evil.example:9090", "evil.example"):
        assert host_refused(policy, host), host


def test_allow_host_admits_a_name_on_any_port_or_on_the_port_given() -> None:
    """--allow-host NAME: any port; NAME:PORT: that port only; IPv6 in brackets."""
    policy = OriginPolicy(
        "listener",
        "127.0.0.1",
        Allowances(hosts=("proxy", "pinned.test:9000", "[fe80::2]:7")),
    )
    assert not host_refused(policy, "proxy:1")
    assert not host_refused(policy, "PROXY:9090")
    assert not host_refused(policy, "proxy")
    assert not host_refused(policy, "pinned.test:9000")
    assert host_refused(policy, "pinned.test:9001")
    assert host_refused(policy, "pinned.test")
    assert not host_refused(policy, "[fe80::2]:7")
    assert host_refused(policy, "[fe80::2]:8")
    assert host_refused(policy, "proxy.evil.example:1")


def test_an_origin_is_refused_unless_it_is_the_servers_own_or_allowed() -> None:
    """Origin: absent (not a page), the request's own (http:// and its Host), or listed."""
    policy = OriginPolicy(
        "listener", "127.0.0.1", Allowances(origins=("https://IDE.example", "http://lab:3000"))
    )
    host = f"127.0.0.1:{PORT}"
    for origin in (
        None,
        f"http://127.0.0.1:{PORT}",
        f"HTTP://127.0.0.1:{PORT}",
        "https://ide.example",
        "https://ide.example:443",
        "http://lab:3000",
    ):
        assert policy.refusal(host, origin) is None, origin
    for origin in (
        "http://evil.example",
        f"https://127.0.0.1:{PORT}",  # another scheme: another origin
        f"http://localhost:{PORT}",  # another host than the request's own
        f"http://127.0.0.1:{PORT + 1}",
        "http://ide.example",
        "https://ide.example:8443",
        "https://ide.example.evil.example",
        "http://lab",
        "null",
        "*",
        "",
        "https://ide.example/",
        "https://user@ide.example",
    ):
        refusal = policy.refusal(host, origin)
        assert refusal is not None, origin
        assert refusal == (
            "origin",
            f"origin {origin} is not allowed (see --allow-origin)",
        )


def test_a_listener_in_tls_takes_https_as_its_own_origin_and_443_as_its_default_port() -> None:
    """Served over TLS, the listener's own pages are ``https://`` and its Host (its address, as
    ``http://`` pages are a plain listener's); ``http://`` with that Host is another origin. A
    ``Host`` without a port names 443, which ``--allow-host NAME:443`` admits."""
    policy = OriginPolicy("listener", "127.0.0.1", Allowances(hosts=("proxy:443",)), secure=True)
    host = f"127.0.0.1:{PORT}"
    assert policy.refusal(host, f"https://127.0.0.1:{PORT}") is None
    assert policy.refusal(host, f"HTTPS://127.0.0.1:{PORT}") is None
    assert policy.refusal("127.0.0.1", "https://127.0.0.1:443") is None
    assert policy.refusal(host, f"http://127.0.0.1:{PORT}") is not None
    assert policy.refusal(host, f"https://localhost:{PORT}") is not None
    assert not host_refused(policy, "proxy")
    assert not host_refused(policy, "proxy:443")
    assert host_refused(policy, "proxy:80")
    plain = OriginPolicy("listener", "127.0.0.1", Allowances(hosts=("proxy:443",)))
    assert host_refused(plain, "proxy")  # port 80 on a plain listener


def test_the_refusal_names_the_option_of_its_server_and_shortens_what_it_repeats() -> None:
    """The control API's refusals name --admin-allow-origin; a long value is cut."""
    admin = OriginPolicy("admin", "127.0.0.1")
    assert admin.refusal(f"localhost:{PORT}", "http://evil.example") == (
        "origin",
        "origin http://evil.example is not allowed (see --admin-allow-origin)",
    )
    long = "http://" + "a" * 5000 + ".example"
    refusal = admin.refusal(f"localhost:{PORT}", long)
    assert refusal is not None
    assert len(refusal[1]) < 200
    assert admin.refusal(None, None) == (
        "host",
        "a Host header is required (see --allow-host)",
    )
    assert admin.refusal("evil.example", None) == (
        "host",
        "host evil.example is not allowed (see --allow-host)",
    )


def test_any_origin_and_null_are_admitted_only_when_listed() -> None:
    """``*`` admits every origin (``null`` too); ``null`` alone admits only itself."""
    every = OriginPolicy("listener", "127.0.0.1", Allowances(origins=("*",)))
    host = f"localhost:{PORT}"
    for origin in ("http://evil.example", "null", "moz-extension://x"):
        assert every.refusal(host, origin) is None
    assert every.refusal(f"evil.example:{PORT}", None) is not None  # Host still checked
    sandboxed = OriginPolicy("listener", "127.0.0.1", Allowances(origins=("null",)))
    assert sandboxed.refusal(host, "null") is None
    assert sandboxed.refusal(host, "http://evil.example") is not None


@pytest.mark.parametrize("text", ["", "a b", "host/path", "user@host", "host:99999", "[::1", "*"])
def test_an_allow_host_that_is_not_a_host_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="--allow-host: expected NAME or NAME:PORT"):
        parse_allowed_host(text)


@pytest.mark.parametrize(
    "text", ["", "ide.example", "https://ide.example/", "https://ide.example/app", "https://"]
)
def test_an_allow_origin_that_is_not_an_origin_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="--admin-allow-origin: expected an origin"):
        parse_allowed_origin(text, option="--admin-allow-origin")
    with pytest.raises(ConfigError):
        OriginPolicy("listener", "127.0.0.1", Allowances(origins=(text,)))
