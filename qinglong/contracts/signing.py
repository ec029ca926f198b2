"""The one signing rule of Qinglong's webhooks, out (the ``webhook`` notifier) and in (``hook``
triggers): ``X-Qinglong-Signature: sha256=<hex>``, the HMAC-SHA256 under a shared secret of
``<timestamp>.<raw body>``, where ``X-Qinglong-Timestamp`` is unix seconds (as GitHub and Stripe
sign theirs). A receiver recomputes it over the raw body, compares in constant time and refuses a
timestamp outside its window, so a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Qinglong-Signature"
TIMESTAMP_HEADER = "X-Qinglong-Timestamp"
#: How far a timestamp may be from the receiver's clock, either way (seconds).
DEFAULT_TOLERANCE_S = 300
#: A timestamp is unix seconds in decimal, at most this many digits.
MAX_TIMESTAMP_DIGITS = 12


def signature(secret_value: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``<timestamp>.<body>`` under the secret."""
    mac = hmac.new(secret_value.encode("utf-8"), timestamp.encode("ascii") + b"." + body,
                   hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def timestamp_fresh(timestamp: str, *, now_s: float, tolerance_s: int = DEFAULT_TOLERANCE_S) -> bool:
    """The timestamp is decimal unix seconds within ``tolerance_s`` of ``now_s``."""
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > MAX_TIMESTAMP_DIGITS:
        return False
    return abs(now_s - int(timestamp)) <= tolerance_s


def verify(secret_value: str, timestamp: str, body: bytes, header: str, *, now_s: float,
           tolerance_s: int = DEFAULT_TOLERANCE_S) -> bool:
    """What a receiver does: the timestamp is fresh and the signature matches (constant time)."""
    if not timestamp_fresh(timestamp, now_s=now_s, tolerance_s=tolerance_s):
        return False
    expected = signature(secret_value, timestamp, body).encode("ascii")
    try:
        given = header.encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(expected, given)


__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "DEFAULT_TOLERANCE_S", "signature",
           "timestamp_fresh", "verify"]
