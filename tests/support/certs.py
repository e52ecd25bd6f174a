"""Throwaway certificates for the TLS tests: a CA of the test's own and leaves it signed.

:func:`make_pki` writes, in a directory, a CA (``ca.pem``) and a server certificate for
``localhost``, ``127.0.0.1`` and ``::1`` with its key (``server.pem``, ``server.key``), plus what
the error cases need: an expired certificate (``expired.pem``, with ``expired.key``), a key that
matches no certificate (``other.key``), the server's key encrypted with a passphrase
(``encrypted.key``) and a certificate of another CA (``stranger.pem``, its CA unknown to
everybody). Keys are EC P-256: quick to make, and every TLS stack takes them.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "make_pki"]

DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Pki:
    """The files :func:`make_pki` wrote."""

    ca: Path
    cert: Path
    key: Path
    expired: Path
    expired_key: Path
    other_key: Path
    encrypted_key: Path
    stranger: Path
    stranger_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _ca(common: str, now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - DAY)
        .not_valid_after(now + 30 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
) -> x509.Certificate:
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    return (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(
    path: Path, key: ec.EllipticCurvePrivateKey, passphrase: bytes | None = None
) -> Path:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase is not None
        else serialization.NoEncryption()
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    path.chmod(0o600)
    return path


def make_pki(directory: Path) -> Pki:
    """A CA and its certificates in ``directory`` (see the module)."""
    now = datetime.datetime.now(datetime.UTC)
    ca, ca_key = _ca("acp-proxy test CA", now)
    key = _key()
    expired_key = _key()
    stranger_ca, stranger_ca_key = _ca("a CA nobody trusts", now)
    stranger_key = _key()
    return Pki(
        ca=_write_cert(directory / "ca.pem", ca),
        cert=_write_cert(
            directory / "server.pem", _leaf(ca, ca_key, key, now - DAY, now + 7 * DAY)
        ),
        key=_write_key(directory / "server.key", key),
        expired=_write_cert(
            directory / "expired.pem",
            _leaf(ca, ca_key, expired_key, now - 30 * DAY, now - 2 * DAY),
        ),
        expired_key=_write_key(directory / "expired.key", expired_key),
        other_key=_write_key(directory / "other.key", _key()),
        encrypted_key=_write_key(directory / "encrypted.key", key, b"a passphrase"),
        stranger=_write_cert(
            directory / "stranger.pem",
            _leaf(stranger_ca, stranger_ca_key, stranger_key, now - DAY, now + 7 * DAY),
        ),
        stranger_key=_write_key(directory / "stranger.key", stranger_key),
    )
