"""Skip records age out on the edge: the dispatcher's retention sweep deletes both kinds once
older than ``[execution] skip_retention_days``, never the last hour's."""

from __future__ import annotations

import asyncio
import sqlite3

from dispatcher_helpers import now_ms, running, until, write_settings

from qinglong.contracts.execution import MIN_SKIP_RETENTION_MS

HOUR = 3_600_000


def _seed(db: str, recorded_at_ms: int, n: int) -> None:
    conn = sqlite3.connect(db)
    try:
        with conn:
            for _ in range(n):
                conn.execute("INSERT INTO schedule_skips (project_id, trigger_id, trigger_revision, policy, "
                             "first_skipped_ms, last_skipped_ms, count, count_exact, recorded_at_ms) "
                             "VALUES ('p', 'tr', 1, 'skip', ?, ?, 1, 1, ?)",
                             (recorded_at_ms, recorded_at_ms, recorded_at_ms))
                conn.execute("INSERT INTO run_skips (run_id, project_id, task_id, trigger_id, "
                             "scheduled_for_ms, reason, recorded_at_ms) VALUES "
                             "(lower(hex(randomblob(16))), 'p', 't', 'tr', ?, 'skipped', ?)",
                             (recorded_at_ms, recorded_at_ms))
    finally:
        conn.close()


def _left(db: str) -> tuple[list[int], list[int]]:
    conn = sqlite3.connect(db)
    try:
        return ([r for (r,) in conn.execute("SELECT recorded_at_ms FROM schedule_skips ORDER BY id")],
                [r for (r,) in conn.execute("SELECT recorded_at_ms FROM run_skips ORDER BY id")])
    finally:
        conn.close()


def test_a_running_plane_with_a_tiny_skip_retention_prunes_old_skips_and_keeps_the_last_hour(tmp_path):
    """A router's SQLite file grew by every skip record, forever; the recent-skips figures of
    `qinglong status` still need the last hour's, whatever the retention says."""
    settings = write_settings(tmp_path, skip_retention_days=0.000001, prune_batch=2)
    db = str(tmp_path / "q.db")

    async def body() -> None:
        async with running(settings) as h:
            now = now_ms()
            _seed(db, now - 3 * HOUR, 5)  # more than one batch of each kind
            young = now - MIN_SKIP_RETENTION_MS + 10 * 60_000
            _seed(db, young, 1)
            before = (await h.backend.reader().store_stats()).skipped_recent
            assert before == 2
            await until(lambda: _left(db) == ([young], [young]), "old skip records pruned")
            assert (await h.backend.reader().store_stats()).skipped_recent == before

    asyncio.run(body())
