"""What the proxy reads of a PEM certificate itself: the first certificate, and its validity.

``--tls-cert`` is checked before the listener starts: a certificate that has expired (or is not
valid yet) would be served, and refused by every Client, one handshake at a time. The ``ssl``
module reads no validity dates from a file, and no X.509 library is a dependency of the proxy,
so this module reads them from the DER the PEM block holds: ``Certificate`` is a SEQUENCE whose
first element, ``tbsCertificate``, is a SEQUENCE of an optional ``[0]`` version, the serial
number, the signature algorithm, the issuer and then ``Validity`` (RFC 5280 4.1), two times
(``UTCTime`` or ``GeneralizedTime``). Nothing else is decoded; the signature, the key and the
names are OpenSSL's to judge when the ``ssl`` module loads the file.

Sans-I/O: bytes in, values out; the current time is the caller's. Input is hostile: every length
is checked against what is left, and anything unexpected is ``None``, never an exception.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["Validity", "first_certificate", "validity"]

_PEM_CERTIFICATE = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*([A-Za-z0-9+/=\s]*?)\s*-----END CERTIFICATE-----"
)

_SEQUENCE = 0x30
_INTEGER = 0x02
_VERSION = 0xA0  # [0] EXPLICIT
_UTC_TIME = 0x17
_GENERALIZED_TIME = 0x18


@dataclass(frozen=True, slots=True)
class Validity:
    """When a certificate may be used (both ends included, RFC 5280 4.1.2.5)."""

    not_before: datetime
    not_after: datetime

    def problem(self, now: datetime) -> str | None:
        """Why the certificate cannot be used at ``now`` (expired, not valid yet); None when it
        can."""
        if now > self.not_after:
            return f"the certificate expired on {_shown(self.not_after)}"
        if now < self.not_before:
            return f"the certificate is not valid before {_shown(self.not_before)}"
        return None


def _shown(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def first_certificate(pem: bytes) -> bytes | None:
    """The DER of the first ``CERTIFICATE`` block of ``pem``; None when there is none, or its
    base64 does not decode."""
    match = _PEM_CERTIFICATE.search(pem)
    if match is None:
        return None
    try:
        return base64.b64decode(b"".join(match[1].split()), validate=True)
    except (binascii.Error, ValueError):
        return None


def _element(data: bytes, pos: int, end: int) -> tuple[int, int, int] | None:
    """(tag, start of content, end of content) of the DER element at ``pos``, within ``end``."""
    if pos + 2 > end:
        return None
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or pos + count > end:
            return None  # indefinite lengths are not DER; four bytes of length are plenty
        length = int.from_bytes(data[pos : pos + count], "big")
        pos += count
    if pos + length > end:
        return None
    return tag, pos, pos + length


def _time(tag: int, text: bytes) -> datetime | None:
    """A ``UTCTime`` (``YYMMDDHHMMSSZ``) or ``GeneralizedTime`` (``YYYYMMDDHHMMSSZ``)."""
    if tag == _UTC_TIME and len(text) == 13:
        year = int(text[:2]) if text[:2].isdigit() else -1
        text = (b"19" if year >= 50 else b"20") + text  # RFC 5280 4.1.2.5.1
    elif tag != _GENERALIZED_TIME or len(text) != 15:
        return None
    if not (text[:14].isdigit() and text.endswith(b"Z")):
        return None
    try:
        return datetime.strptime(text[:14].decode("ascii"), "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    except ValueError:  # a 13th month, a 31st of June
        return None


def validity(der: bytes) -> Validity | None:
    """The validity of the DER certificate ``der``; None when it does not read as one."""
    certificate = _element(der, 0, len(der))
    if certificate is None or certificate[0] != _SEQUENCE:
        return None
    tbs = _element(der, certificate[1], certificate[2])
    if tbs is None or tbs[0] != _SEQUENCE:
        return None
    _, pos, end = tbs
    expected = [_VERSION, _INTEGER, _SEQUENCE, _SEQUENCE]  # version, serial, algorithm, issuer
    for index, want in enumerate(expected):
        element = _element(der, pos, end)
        if element is None:
            return None
        if element[0] != want:
            if index == 0:  # the version is optional (v1 certificates leave it out)
                continue
            return None
        pos = element[2]
    dates = _element(der, pos, end)
    if dates is None or dates[0] != _SEQUENCE:
        return None
    before = _element(der, dates[1], dates[2])
    if before is None:
        return None
    after = _element(der, before[2], dates[2])
    if after is None:
        return None
    not_before = _time(before[0], der[before[1] : before[2]])
    not_after = _time(after[0], der[after[1] : after[2]])
    if not_before is None or not_after is None:
        return None
    return Validity(not_before, not_after)
