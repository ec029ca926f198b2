"""The token rules both stores and the HTTP layer share."""

from __future__ import annotations

from hypothesis import given, strategies as st

from qinglong.contracts.tokens import SCOPES, new_secret, scope_allows, token_digest

scope = st.sampled_from(SCOPES)


@given(scope, scope, scope)
def test_scopes_nest_admin_over_write_over_run_over_read(a, b, c):
    """A read token allowed to run, or a run token to publish, would let a dashboard's credential
    start commands on the hosts."""
    assert scope_allows(a, a)
    assert scope_allows(a, b) == (SCOPES.index(a) >= SCOPES.index(b))
    if scope_allows(a, b) and scope_allows(b, c):
        assert scope_allows(a, c)
    assert scope_allows("admin", b) and (b == "read" or not scope_allows("read", b))


@given(st.text(max_size=80))
def test_a_digest_never_contains_its_secret_and_secrets_do_not_repeat(text):
    """A digest that held its secret, or two tokens sharing a secret, would turn the stored table
    into a list of credentials."""
    digest = token_digest(text)
    assert len(digest) == 64 and (not text or text not in digest or len(text) < 2)
    secrets = {new_secret() for _ in range(50)}
    assert len(secrets) == 50 and all(s.startswith("qlt_") and len(s) == 47 for s in secrets)
