"""API tokens and the audit log on every backend (see ``conftest.py``): only a digest is stored,
a revoked token is found revoked at once, names are unique among live tokens, and every change
writes its audit entry in its own transaction (a refused change writes neither)."""

from __future__ import annotations

import pytest

from qinglong.contracts.errors import AlreadyExists, NotFound
from qinglong.contracts.tokens import CURRENT_AUDIT, AuditEntry, AuditScope, token_digest
from qinglong.host.tokens import create_token, revoke_token
from qinglong.testing.conformance.store import seed


async def test_a_token_is_found_by_its_digest_only_and_revoked_at_once(harness):
    """A store that kept the secret would hand every credential to whoever reads a backup; one
    that still found a revoked token would let a leaked token keep running commands."""
    store = harness.backend.tokens()
    record, secret = await create_token(store, "ci", "run", ["p1"], 86_400_000)
    found = await store.token_by_digest(token_digest(secret))
    assert found is not None and (found.name, found.scope, found.projects) == ("ci", "run", ("p1",))
    assert found.revoked_at_ms is None and found.expires_at_ms == record.expires_at_ms
    assert await store.token_by_digest(token_digest(secret + "x")) is None
    assert await store.token_by_digest(secret) is None  # the secret itself is not a key
    listed = await store.list_tokens()
    assert [t.name for t in listed] == ["ci"] and secret not in repr(listed)
    with pytest.raises(AlreadyExists):
        await create_token(store, "ci", "read")
    await revoke_token(store, "ci")
    assert (await store.token_by_digest(token_digest(secret))).revoked_at_ms is not None
    with pytest.raises(NotFound):
        await revoke_token(store, "ci")
    again, _ = await create_token(store, "ci", "read")  # the name is free again
    assert again.token_id != record.token_id
    actions = [(e.action, e.object, e.result) for e in await store.list_audit()]
    assert actions == [("token.create", "ci", "ok"), ("token.revoke", "ci", "ok"), ("token.create", "ci", "ok")][::-1]
    assert all(secret not in repr(e) for e in await store.list_audit())


async def test_a_change_writes_its_pending_audit_entry_in_its_own_transaction(harness):
    """An audit entry written after the answer is lost in a crash between the two (a change nobody
    can attribute); one written for a refused change records what never happened."""
    await seed(harness)
    store = harness.backend.tokens()
    entry = AuditEntry(1, "ops-bot", "tid", "10.0.0.7", "project.create", "p9")
    scope = AuditScope(entry)
    token = CURRENT_AUDIT.set(scope)
    try:
        await harness.publisher.create_project("p9")
    finally:
        CURRENT_AUDIT.reset(token)
    assert scope.written
    refused = AuditScope(AuditEntry(2, "ops-bot", "tid", "10.0.0.7", "project.create", "p9"))
    token = CURRENT_AUDIT.set(refused)
    try:
        with pytest.raises(AlreadyExists):
            await harness.publisher.create_project("p9")
    finally:
        CURRENT_AUDIT.reset(token)
    assert not refused.written
    entries = await store.list_audit()
    assert [(e.actor, e.source, e.action, e.object, e.at_ms) for e in entries] == [
        ("ops-bot", "10.0.0.7", "project.create", "p9", 1)]


async def test_a_console_link_is_kept_as_a_digest_and_signs_in_once_before_it_expires(harness):
    """A store that kept the code would let whoever reads a backup sign in as admin; a link
    redeemed twice (or two browsers racing on it) gives a copied URL a second admin session; an
    expired link that still worked outlives the minutes the operator meant; a refused redemption
    that wrote anything lets a guesser fill the audit log."""
    import asyncio

    from qinglong.host.tokens import LINK_ACTOR, create_console_link

    store = harness.backend.tokens()
    code, link_id, expires = await create_console_link(store, 60_000)
    assert code.startswith("qlc_") and len(code) >= 40
    sign_in = AuditEntry(expires - 30_000, LINK_ACTOR, None, "10.0.0.9", "console.sign_in", "", "ok",
                         {"scope": "admin"})
    assert await store.redeem_console_link(code, expires - 30_000, sign_in) == ("unknown", None)  # not a key
    assert await store.redeem_console_link(token_digest(code + "x"), expires - 30_000, sign_in) == ("unknown", None)
    results = await asyncio.gather(*[store.redeem_console_link(token_digest(code), expires - 30_000, sign_in)
                                     for _ in range(4)])
    assert sorted(results) == sorted([("ok", link_id)] + [("used", None)] * 3), results
    assert await store.redeem_console_link(token_digest(code), expires - 1, sign_in) == ("used", None)

    late, late_id, late_expires = await create_console_link(store, 1)
    assert await store.redeem_console_link(token_digest(late), late_expires, sign_in) == ("expired", None)
    assert await store.redeem_console_link(token_digest(late), late_expires - 1, sign_in) == ("ok", late_id)

    entries = [(e.actor, e.source, e.action, e.object, e.result) for e in await store.list_audit()]
    assert sorted(entries) == sorted([("cli", "local", "console.link", link_id, "ok"),
                                      (LINK_ACTOR, "10.0.0.9", "console.sign_in", link_id, "ok"),
                                      ("cli", "local", "console.link", late_id, "ok"),
                                      (LINK_ACTOR, "10.0.0.9", "console.sign_in", late_id, "ok")]), entries
    assert all(code not in repr(e) and late not in repr(e) for e in await store.list_audit())
