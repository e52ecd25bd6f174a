"""TLS on both sides of the proxy: the listener's certificate, and the trust toward the Agent.

``--listen https://...`` or ``wss://...`` serves TLS with ``--tls-cert`` (the certificate, then
any intermediates, PEM) and ``--tls-key`` (its private key, PEM, unencrypted): both are read and
checked before anything starts, and a file that cannot be used is one located error (exit 2):
unreadable, not PEM, a certificate that has expired or is not valid yet, a key that does not
match the certificate, a key encrypted with a passphrase (the proxy never prompts for one).

``--upstream https://...`` or ``wss://...`` verifies the Agent's certificate and its name
against the system's trust store, or against ``--tls-ca`` (a PEM bundle, which then replaces the
system store: a private CA's bundle trusts that CA alone). ``--tls-insecure`` verifies nothing:
a warning says so when the proxy starts and on every connection made so.

The control API (``--admin``) stays plain HTTP: it listens on loopback unless told otherwise.

Files are bounded before they are read: :data:`MAX_PEM_BYTES` for a certificate or a key,
:data:`MAX_BUNDLE_BYTES` for a CA bundle.
"""

from __future__ import annotations

import ssl
from datetime import UTC, datetime
from pathlib import Path

from proxy.core.errors import ConfigError, OptionError, os_cause
from proxy.core.x509 import first_certificate, validity
from proxy.shell.log import get_logger

__all__ = [
    "CA_OPTION",
    "CERT_OPTION",
    "INSECURE_OPTION",
    "KEY_OPTION",
    "MAX_BUNDLE_BYTES",
    "MAX_PEM_BYTES",
    "agent_tls",
    "check_listener",
    "check_upstream",
    "client_context",
    "insecure",
    "listener_tls",
    "log_connected",
    "server_context",
    "warn_insecure",
]

log = get_logger("proxy.tls")

INSECURE = "NOT VERIFIED (--tls-insecure): anyone on the way can read and change the messages"

MAX_PEM_BYTES = 1024 * 1024
"""The largest certificate chain or key file read: a chain of a few certificates is a few KiB."""
MAX_BUNDLE_BYTES = 16 * 1024 * 1024
"""The largest CA bundle read: the system's whole bundle is a few hundred KiB."""

CERT_OPTION = "--tls-cert"
KEY_OPTION = "--tls-key"
CA_OPTION = "--tls-ca"
INSECURE_OPTION = "--tls-insecure"


def listener_tls(
    url: str, *, secure: bool, cert: Path | None, key: Path | None, now: datetime | None = None
) -> ssl.SSLContext | None:
    """The TLS of a listener at ``url`` (``secure``: in TLS) from ``--tls-cert`` and
    ``--tls-key``, checked at ``now`` (default: the clock's); None for a plain one. An
    :class:`~proxy.core.errors.OptionError` for options without their listener, or a file
    that cannot be used."""
    if (cert is None) != (key is None):
        given, missing = (CERT_OPTION, KEY_OPTION) if key is None else (KEY_OPTION, CERT_OPTION)
        raise OptionError(f"{given} needs {missing} too")
    check_listener(url, secure=secure, served=cert is not None)
    if cert is None or key is None:
        return None
    try:
        return server_context(cert, key, now=now or datetime.now(UTC))
    except ConfigError as exc:
        raise OptionError(str(exc)) from None


def check_listener(url: str, *, secure: bool, served: bool) -> None:
    """Refuse a listener in TLS without a certificate (``served``), or one given for a plain
    listener: an :class:`~proxy.core.errors.OptionError`."""
    if secure and not served:
        raise OptionError(f"a listener in TLS ({url}) needs {CERT_OPTION} and {KEY_OPTION}")
    if served and not secure:
        raise OptionError(
            f"{CERT_OPTION} and {KEY_OPTION} serve a listener in TLS: "
            "--listen https://HOST:PORT/PATH or wss://HOST:PORT/PATH"
        )


def agent_tls(*, secure: bool, ca: Path | None, insecure: bool = False) -> ssl.SSLContext | None:
    """How an Agent (``secure``: in TLS) is verified, from ``--tls-ca`` and ``--tls-insecure``;
    None for the system's trust store, or a plain Agent. An
    :class:`~proxy.core.errors.OptionError` for options without their Agent in TLS, both
    given, or a bundle that cannot be used."""
    if ca is not None and insecure:
        raise OptionError(f"{CA_OPTION} and {INSECURE_OPTION} exclude each other")
    verified = ca is not None or insecure
    check_upstream(secure=secure, verified=verified)
    if not verified:
        return None
    try:
        return client_context(ca, verify=not insecure)
    except ConfigError as exc:
        raise OptionError(str(exc)) from None


def check_upstream(*, secure: bool, verified: bool) -> None:
    """Refuse the Agent's trust (``verified``: given) for an Agent that is not in TLS: an
    :class:`~proxy.core.errors.OptionError`."""
    if verified and not secure:
        raise OptionError(
            f"{CA_OPTION} and {INSECURE_OPTION} are for an Agent in TLS: "
            "https://HOST:PORT/PATH or wss://HOST:PORT/PATH"
        )


def _read(path: Path, option: str, bound: int) -> bytes:
    """The bytes of ``path`` (``bound`` at most); a located error when it cannot be read."""
    try:
        with path.open("rb") as file:
            data = file.read(bound + 1)
    except OSError as exc:
        raise ConfigError(f"{option}: cannot read {path}: {os_cause(exc)}") from None
    if len(data) > bound:
        raise ConfigError(f"{option}: {path} is larger than {bound} bytes: not a PEM file")
    return data


def _no_passphrase() -> bytes:
    """The passphrase offered for an encrypted key: none (OpenSSL would prompt on the terminal
    without a callback)."""
    raise _Encrypted


class _Encrypted(Exception):
    """The key asked for a passphrase."""


def server_context(cert: Path, key: Path, *, now: datetime) -> ssl.SSLContext:
    """The listener's TLS: ``cert`` (a PEM chain, the server's certificate first) and ``key``
    checked at ``now``; :class:`~proxy.core.errors.ConfigError` naming the option and the file
    that cannot be used, and why."""
    pem = _read(cert, CERT_OPTION, MAX_PEM_BYTES)
    der = first_certificate(pem)
    if der is None:
        raise ConfigError(
            f"{CERT_OPTION}: {cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )
    dates = validity(der)
    if dates is None:
        raise ConfigError(f"{CERT_OPTION}: {cert}: the first certificate is not X.509")
    problem = dates.problem(now)
    if problem is not None:
        raise ConfigError(f"{CERT_OPTION}: {cert}: {problem}")
    _read(key, KEY_OPTION, MAX_PEM_BYTES)  # readable and bounded, before OpenSSL reads it
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key, password=_no_passphrase)
    except _Encrypted:
        raise ConfigError(
            f"{KEY_OPTION}: {key} is encrypted: give the key without a passphrase"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"{KEY_OPTION}: {key} does not match the certificate of {cert}"
            ) from None
        if not _loads_as_certificates(pem):
            raise ConfigError(f"{CERT_OPTION}: {cert}: not a usable PEM certificate") from None
        raise ConfigError(f"{KEY_OPTION}: {key}: not a usable PEM private key") from None
    return context


def _loads_as_certificates(pem: bytes) -> bool:
    """Whether OpenSSL reads ``pem`` as certificates."""
    try:
        ssl.create_default_context(cadata=pem.decode("ascii", "replace"))
    except ssl.SSLError:
        return False
    return True


def client_context(ca: Path | None = None, *, verify: bool = True) -> ssl.SSLContext:
    """The TLS toward the Agent: its certificate and name verified against ``ca`` (a PEM
    bundle) or, without it, the system's store; ``verify`` false verifies nothing
    (``--tls-insecure``). :class:`~proxy.core.errors.ConfigError` for a bundle that cannot be
    used."""
    if ca is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        pem = _read(ca, CA_OPTION, MAX_BUNDLE_BYTES)
        if first_certificate(pem) is None:
            raise ConfigError(
                f"{CA_OPTION}: {ca} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            )
        try:
            context = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH, cadata=pem.decode("ascii", "replace")
            )
        except ssl.SSLError:
            raise ConfigError(f"{CA_OPTION}: {ca}: not a usable PEM bundle") from None
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def insecure(context: ssl.SSLContext | None) -> bool:
    """Whether ``context`` verifies nothing (``--tls-insecure``)."""
    return context is not None and context.verify_mode == ssl.CERT_NONE


def warn_insecure(context: ssl.SSLContext | None, upstream: str) -> None:
    """Say once, when the proxy starts, that the Agent's certificate will not be verified."""
    if insecure(context):
        log.warning(
            "the agent's TLS certificate and name are not checked", upstream=upstream, tls=INSECURE
        )


def log_connected(url: str, context: ssl.SSLContext | None) -> None:
    """The line of a connection made to the Agent, saying so when it is not verified."""
    if insecure(context):
        log.warning("connected to the agent", url=url, tls=INSECURE)
    else:
        log.info("connected to the agent", url=url)
