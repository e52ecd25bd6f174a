"""The validity the proxy reads of a certificate itself (no sockets, no clock: times passed in)."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

from certs import make_pki
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.x509 import Validity, first_certificate, validity

UTC = datetime.UTC


def certificate(not_before: datetime.datetime, not_after: datetime.datetime) -> bytes:
    """The DER of a self-signed certificate valid from ``not_before`` to ``not_after``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


def pem(der: bytes) -> bytes:
    body = base64.encodebytes(der)
    return b"-----BEGIN CERTIFICATE-----\n" + body + b"-----END CERTIFICATE-----\n"


def test_validity_of_utc_and_generalized_times() -> None:
    """Dates before 2050 are UTCTime, from 2050 on GeneralizedTime (RFC 5280 4.1.2.5): both read."""
    before = datetime.datetime(1999, 12, 31, 23, 59, 58, tzinfo=UTC)
    after = datetime.datetime(2051, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert validity(certificate(before, after)) == Validity(before, after)


def test_the_first_certificate_of_a_chain_is_read() -> None:
    """A chain's first block is the server's certificate; text around the blocks is ignored."""
    first = certificate(
        datetime.datetime(2020, 1, 1, tzinfo=UTC), datetime.datetime(2030, 1, 1, tzinfo=UTC)
    )
    second = certificate(
        datetime.datetime(2021, 1, 1, tzinfo=UTC), datetime.datetime(2022, 1, 1, tzinfo=UTC)
    )
    chain = b"subject=CN=test\n" + pem(first) + pem(second)
    assert first_certificate(chain) == first
    assert (
        first_certificate(b"-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n") is None
    )
    assert first_certificate(b"-----BEGIN CERTIFICATE-----\n*&^\n-----END CERTIFICATE-----") is None


def test_problem_names_expiry_and_not_yet_valid() -> None:
    start = datetime.datetime(2030, 1, 1, tzinfo=UTC)
    end = datetime.datetime(2031, 1, 1, tzinfo=UTC)
    dates = Validity(start, end)
    assert dates.problem(start) is None
    assert dates.problem(end) is None  # both ends included
    late = dates.problem(end + datetime.timedelta(seconds=1))
    assert late == "the certificate expired on 2031-01-01 00:00:00 UTC"
    early = dates.problem(start - datetime.timedelta(seconds=1))
    assert early == "the certificate is not valid before 2030-01-01 00:00:00 UTC"


def test_every_truncation_reads_as_nothing() -> None:
    """Cut anywhere, a certificate is no certificate (and no exception): lengths are checked."""
    der = certificate(
        datetime.datetime(2020, 1, 1, tzinfo=UTC), datetime.datetime(2030, 1, 1, tzinfo=UTC)
    )
    for cut in range(len(der)):
        assert validity(der[:cut]) is None


def test_the_test_pki_reads(tmp_path: Path) -> None:
    """The certificates the TLS tests make (``tests/support/certs.py``) read as they were made."""
    pki = make_pki(tmp_path)
    now = datetime.datetime.now(UTC)
    for path, expired in ((pki.cert, False), (pki.expired, True), (pki.ca, False)):
        der = first_certificate(path.read_bytes())
        assert der is not None
        dates = validity(der)
        assert dates is not None
        assert (dates.problem(now) is not None) == expired


@given(st.binary(max_size=512))
def test_any_bytes_read_without_an_exception(data: bytes) -> None:
    assert validity(data) is None or isinstance(validity(data), Validity)
    assert first_certificate(data) is None or isinstance(first_certificate(data), bytes)
