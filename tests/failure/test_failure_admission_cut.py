"""An admission whose traffic is cut at any point: the whole occurrence or nothing, never a lock.

The admission is one SERIALIZABLE transaction sent as ONE simple-protocol Query message
(``SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; ...; EXECUTE ...``). PostgreSQL executes nothing until
the whole message has arrived, commits at its end and rolls back by itself on error. So a link
that dies while the message is on its way leaves nothing (no transaction, no row lock: the claim
lapses at its database-time expiry and another replica takes the occurrence over), and a link
that dies after the message arrived leaves the whole occurrence committed with the claim cleared
(the client never learns it: the COMMIT-reply-loss case). Before, BEGIN, the statement and COMMIT
travelled separately; a cut between statement and COMMIT left the transaction open with the
schedule row locked, SKIP LOCKED kept every takeover off, and nothing but the server dropping the
session (``transaction_timeout``, PostgreSQL 17+ only) freed the occurrence.

Each case cuts replica P's traffic through the fault proxy at one point of its first admission
message, proves from a superuser session that P's session holds no lock and no open transaction
(the schedule row can be locked with NOWAIT), lets replica Q run, then delivers whatever was held
late and audits: exactly one Run, one Attempt, two Events.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from tests.support.cluster import seed, set_cursor
from tests.failure.failure_helpers import (
    ADMISSION_MESSAGE,
    Figures,
    InProcessReplica,
    occurrence_shape,
    wait_db_time_past,
    wait_for,
    wait_rounds,
)
from devtools.fault_proxy import TO_SERVER, FaultProxy

pytestmark = pytest.mark.postgres

LEASE_MS = 1500

#: where the admission's traffic is cut -> the proxy action on its message
CUTS = {
    # half the message reached the server, then the link went silent (bytes held, not dropped)
    "message_half_sent_then_link_dead": "hold_mid",
    # half the message reached the server, then the connection was reset
    "message_half_sent_then_reset": "cut_mid",
    # the whole message reached the server, then the link went silent for the replies
    "message_sent_then_link_dead": "hold_replies",
}


def _session_of(db, owner: str) -> list[tuple]:
    """State, open transaction id and locks held on the schedules by ``owner``'s sessions."""
    return db.sql(
        "SELECT a.pid, a.state, a.backend_xid::text, "
        "       (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid "
        "          AND (l.relation = 'qinglong.trigger_schedules'::regclass OR l.locktype = 'transactionid')) "
        "FROM pg_stat_activity a WHERE a.application_name = %s", (f"qinglong runtime {owner}",))


def _row_is_free(db) -> bool:
    """True when the schedule row can be locked at once (no session holds it)."""
    with psycopg.connect(db.superuser_dsn(), autocommit=False) as conn:
        try:
            conn.execute("SELECT 1 FROM qinglong.trigger_schedules FOR UPDATE NOWAIT")
            return True
        except psycopg.errors.LockNotAvailable:
            return False
        finally:
            conn.rollback()


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_admission_cut_at_any_point_leaves_the_whole_occurrence_or_nothing_and_never_a_held_lock(failure_db, cut):
    """If a cut admission could leave a transaction open, its row lock would keep every takeover
    off (the occurrence waits as long as the server keeps the session: lost for that time); if a
    message cut in half could still commit after its lease, or a committed one could be admitted
    again by a takeover, the occurrence would be duplicated."""
    db = failure_db
    seed(db, 1)
    set_cursor(db, "tr000", -500)

    async def body():
        proxy = FaultProxy((db.server.host, db.server.port), name="cut").start()
        rule = proxy.arm(TO_SERVER, ADMISSION_MESSAGE, CUTS[cut])
        p = await InProcessReplica(db, "replica-p", proxy=proxy, lease_ms=LEASE_MS).start()
        await wait_for(rule.fired.is_set, what="P's admission message")
        cut_at = db.db_now_ms()
        if CUTS[cut] == "hold_replies":
            # the whole message went on to the server: wait until it has committed there (the
            # Run exists and the claim is cleared), however long a loaded server takes
            await wait_for(lambda: db.count("runs") == 1 and db.sql(
                "SELECT claim_owner FROM qinglong.trigger_schedules")[0][0] is None,
                what="the server to commit the message it received whole")
        # (a half message is never acted upon: nothing to wait for before looking)
        claim = db.sql("SELECT claim_owner, claim_expires_at_ms FROM qinglong.trigger_schedules")[0]
        # the fence recorded by P's claim (the claim committed before the admission was sent)
        fence = db.sql("SELECT claim_expires_at_ms FROM qinglong.trigger_schedules")[0][0]
        sessions = _session_of(db, "replica-p")
        row_free = await asyncio.to_thread(_row_is_free, db)
        runs_at_cut = db.count("runs")
        q = await InProcessReplica(db, "replica-q", lease_ms=LEASE_MS).start()
        if CUTS[cut] == "hold_replies":
            # time enough for a wrongful takeover: P's claim (made before the cut) would have
            # lapsed by database time, and Q has then run rounds of its own
            await wait_db_time_past(db, cut_at + LEASE_MS, "P's claim expiry")
            await wait_rounds([q], 2, "rounds after P's lease would have lapsed")
        else:
            await wait_for(lambda: db.count("runs") > 0, what="Q's takeover")
        runs_before_delivery = db.count("runs")
        proxy.heal()  # anything held arrives now, late
        # the held bytes are delivered (or their connection is gone), then every replica has had
        # rounds in which a late commit or a second admission would show
        await wait_for(lambda: rule.connection is None or rule.connection.closed.is_set()
                       or not rule.connection.pending[TO_SERVER], what="the held bytes to be delivered")
        await wait_for(lambda: not [s for s in _session_of(db, "replica-p") if s[1] == "active"],
                       what="P's sessions to finish what they received")
        await wait_rounds([p, q], 2, "rounds after the late delivery")
        proxy.cut_all()
        for r in (p, q):
            await r.stop()
        proxy.close()
        return p, q, cut_at, claim, fence, sessions, row_free, runs_at_cut, runs_before_delivery

    p, q, cut_at, claim, fence, sessions, row_free, runs_at_cut, runs_before_delivery = asyncio.run(body())
    shape = occurrence_shape(db.superuser_dsn())
    runs = shape["runs"]
    admitted_by = runs[0][1] if runs else None
    admitted_at = runs[0][2] if runs else None
    Figures(f"admission_cut_{cut}", expected=1, found=len(runs), duplicates=max(0, len(runs) - 1),
            missing=1 - min(1, len(runs)),
            recover_s=None if runs_at_cut else (admitted_at - fence) / 1000,
            extra={"admitted_by": admitted_by, "p_sessions_at_cut": sessions, "row_free_at_cut": row_free,
                   "runs_at_cut": runs_at_cut, "runs_before_late_delivery": runs_before_delivery}).show()
    # never a held lock, never an open transaction, whatever the cut
    assert row_free
    for _pid, state, xid, locks in sessions:
        assert state != "idle in transaction" and state != "idle in transaction (aborted)"
        assert xid is None and locks == 0
    assert (len(runs), len(shape["attempts"]), len(shape["events"])) == (1, 1, 2)
    assert shape["schedules"][0][0] is None  # no claim left behind
    if CUTS[cut] == "hold_replies":
        # the whole message arrived: the occurrence committed at once, by P, and nobody took it over
        assert runs_at_cut == 1 and claim[0] is None
        # (its statement may read the clock a moment after the test read cut_at: the server takes
        # up the forwarded message when it can; P's claim, made before the cut, bounds it)
        assert admitted_by == "replica-p" and admitted_at < cut_at + LEASE_MS
        assert q.total("claimed") == 0
    else:
        # nothing ran: P's claim lived until its database-time expiry, then it was taken over by a
        # fresh claim (Q's, or P's own next round on a fresh connection once its cut round was
        # ended); the held half, delivered late or reset, never committed anything
        assert runs_at_cut == 0 and claim[0] == "replica-p"
        assert admitted_at > fence
        assert runs_before_delivery == 1
