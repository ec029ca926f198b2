"""The one signing rule (``qinglong.contracts.signing``): what the ``webhook`` notifier signs,
a ``hook`` trigger verifies. If these failed, a forged or altered request would start a Run,
or a captured one could be replayed after its window."""

from hypothesis import given, strategies as st

from qinglong.contracts import signing
from qinglong.plugins.notify import webhook

secrets = st.text(min_size=1, max_size=64)
bodies = st.binary(max_size=512)
now = st.integers(min_value=10**9, max_value=4 * 10**9)


@given(secrets, bodies, now, st.integers(-300, 300))
def test_a_signed_request_within_the_window_verifies(secret, body, now_s, skew):
    ts = str(now_s + skew)
    assert signing.verify(secret, ts, body, signing.signature(secret, ts, body), now_s=now_s)


@given(secrets, bodies, bodies, now)
def test_another_body_never_verifies_under_the_same_signature(secret, body, other, now_s):
    ts = str(now_s)
    header = signing.signature(secret, ts, body)
    assert signing.verify(secret, ts, other, header, now_s=now_s) == (body == other)


@given(secrets, secrets, bodies, now)
def test_another_secret_never_verifies(secret, other, body, now_s):
    ts = str(now_s)
    header = signing.signature(secret, ts, body)
    assert signing.verify(other, ts, body, header, now_s=now_s) == (secret == other)


@given(secrets, bodies, now, st.integers(301, 10**6), st.sampled_from([1, -1]))
def test_a_timestamp_outside_the_window_is_refused_even_correctly_signed(secret, body, now_s, off, sign):
    ts = str(now_s + sign * off)
    assert not signing.verify(secret, ts, body, signing.signature(secret, ts, body), now_s=now_s)


@given(st.sampled_from([" 1700000000", "+1700000000", "1700000000\n", "1_700_000_000", "١٧٠٠٠٠٠٠٠٠"]))
def test_a_timestamp_not_plain_decimal_digits_is_refused(ts):
    """int() accepts these; the signed text would differ from the time checked."""
    assert not signing.timestamp_fresh(ts, now_s=1_700_000_000)


@given(secrets, bodies, now, st.text(max_size=80))
def test_a_header_that_is_not_ascii_or_not_the_signature_is_refused(secret, body, now_s, header):
    ts = str(now_s)
    assert signing.verify(secret, ts, body, header, now_s=now_s) == (header == signing.signature(secret, ts, body))


def test_the_notifier_signs_with_the_contract_rule():
    """One rule: the notifier's function is the contract's, not a copy that could drift."""
    assert webhook.signature is signing.signature and webhook.verify is signing.verify
