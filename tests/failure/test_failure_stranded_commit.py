"""An admission stranded between its statement and its COMMIT.

The admission statement checks the whole fence and writes everything while the lease is live;
its COMMIT travels in a later packet. If the link dies in between (seen in the namespace link-cut
test), the server holds an open transaction with the schedule row locked. The claim's lease
expires, but the claim statement skips locked rows, so no replica can take the schedule over
until the transaction ends: safety holds (nothing can be admitted twice), and the occurrence
waits for the stranded COMMIT or for the server to end the session.

Without a server-side bound, a replica that never comes back keeps the row locked until TCP gives
up on the peer. ``idle_in_transaction_session_timeout`` does not help here: psycopg's pipeline
leaves the server mid-batch (no Sync yet, so no ReadyForQuery and no idle timer; the session was
seen sitting in "idle in transaction" past the timeout). ``transaction_timeout`` (PostgreSQL 17+)
does: set for the runtime role, the server ends the stranded transaction, the lease then lapses
as usual and the late COMMIT meets a closed session. The test shows both, through the fault proxy
holding exactly the COMMIT.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.cluster.conftest import seed, set_cursor
from tests.failure.failure_helpers import (
    COMMIT_MESSAGE,
    Figures,
    InProcessReplica,
    occurrence_shape,
    wait_for,
)
from tests.failure.fault_proxy import TO_SERVER, FaultProxy

pytestmark = pytest.mark.postgres

LEASE_MS = 1500


@pytest.mark.parametrize("transaction_timeout_ms", [None, 1000], ids=["no_server_bound", "transaction_timeout"])
def test_stranded_commit_keeps_its_row_locked_so_no_takeover_can_admit_it_twice(failure_db, transaction_timeout_ms):
    """If the row lock of a transaction whose COMMIT is in flight did not keep the other
    replicas off the schedule, a takeover would admit the occurrence and the late COMMIT would
    admit it again; with the server-side transaction timeout, the stranded transaction must be rolled
    back (its late COMMIT fails) and the takeover must admit the occurrence exactly once."""
    db = failure_db
    if transaction_timeout_ms is not None:
        db.sql(f"ALTER ROLE qinglong_runtime IN DATABASE {db.dbname} "
               f"SET transaction_timeout = {int(transaction_timeout_ms)}")
    seed(db, 1)
    set_cursor(db, "tr000", -500)

    async def body():
        stranded_proxy = FaultProxy((db.server.host, db.server.port), name="stranded").start()
        rule = stranded_proxy.arm(TO_SERVER, COMMIT_MESSAGE, "hold")
        p = await InProcessReplica(db, "replica-p", proxy=stranded_proxy, lease_ms=LEASE_MS).start()
        await wait_for(rule.fired.is_set, 10, what="P's COMMIT")
        held_at = db.db_now_ms()
        claim = db.sql("SELECT claim_owner, claim_expires_at_ms FROM qinglong.trigger_schedules")[0]
        q = await InProcessReplica(db, "replica-q", lease_ms=LEASE_MS).start()
        await asyncio.sleep(LEASE_MS / 1000 + 2.0)
        runs_before_heal = db.count("runs")
        q_claims_before_heal = q.total("claimed")
        healed_at = db.db_now_ms()
        stranded_proxy.heal()
        await wait_for(lambda: db.count("runs") > 0, 10, what="a Run")
        await asyncio.sleep(1.0)
        for r in (p, q):
            await r.stop()
        stranded_proxy.close()
        return p, q, held_at, claim, runs_before_heal, q_claims_before_heal, healed_at

    p, q, held_at, claim, runs_before_heal, q_claims_before_heal, healed_at = asyncio.run(body())
    shape = occurrence_shape(db.superuser_dsn())
    (state, admitted_by, admitted_at, _), = shape["runs"]
    figures = Figures(f"stranded_commit_{'transaction_timeout' if transaction_timeout_ms else 'no_server_bound'}",
                      expected=1, found=len(shape["runs"]), duplicates=len(shape["runs"]) - 1,
                      missing=1 - len(shape["runs"]),
                      recover_s=((admitted_at if admitted_by == "replica-q" else healed_at) - claim[1]) / 1000,
                      extra={"admitted_by": admitted_by, "runs_before_heal": runs_before_heal,
                             "q_claims_before_heal": q_claims_before_heal,
                             "p_errors": p.total("errors")}).show()
    assert claim[0] == "replica-p"
    assert (len(shape["runs"]), len(shape["attempts"]), len(shape["events"])) == (1, 1, 2)
    assert shape["schedules"][0][0] is None
    if transaction_timeout_ms is None:
        # the occurrence waited for the stranded COMMIT: no takeover while the row was locked
        assert runs_before_heal == 0 and q_claims_before_heal == 0
        assert admitted_by == "replica-p" and admitted_at < claim[1]
    else:
        # the server rolled the stranded transaction back; Q took over after the expiry and
        # P's late COMMIT met a closed session
        assert runs_before_heal == 1
        assert admitted_by == "replica-q" and admitted_at > claim[1]
        assert p.total("errors") >= 1
