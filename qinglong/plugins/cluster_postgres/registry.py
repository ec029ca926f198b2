"""Registered workers (:class:`~qinglong.contracts.worker.WorkerRegistry`) on the admin role's
pool: register, rotate and list through the table's privileges, revoke through
``qinglong.worker_revoke`` (the registration, the open session and its Runs in one transaction)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence

from qinglong.contracts.errors import AlreadyExists, NotFound, quoted
from qinglong.contracts.worker import WorkerRegistration

_COLUMNS = "worker_id, labels, projects, capacity, created_at_ms, rotated_at_ms, revoked_at_ms"

_REGISTER = f"""
INSERT INTO qinglong.worker_registrations AS r ({_COLUMNS}, token_digest)
VALUES (%s, %s, %s, %s, %s, NULL, NULL, %s)
ON CONFLICT (worker_id) DO UPDATE
SET labels = excluded.labels, projects = excluded.projects, capacity = excluded.capacity,
    created_at_ms = excluded.created_at_ms, rotated_at_ms = NULL, revoked_at_ms = NULL,
    token_digest = excluded.token_digest
WHERE r.revoked_at_ms IS NOT NULL
RETURNING r.worker_id
"""
_ROTATE = f"""
UPDATE qinglong.worker_registrations r SET token_digest = %s, rotated_at_ms = %s
WHERE r.worker_id = %s AND r.revoked_at_ms IS NULL
RETURNING {_COLUMNS}
"""
_LIST = f"SELECT {_COLUMNS} FROM qinglong.worker_registrations ORDER BY worker_id"
_REVOKE = "SELECT qinglong.worker_revoke(%s)"


def _registration(row: Sequence[Any]) -> WorkerRegistration:
    worker_id, labels, projects, capacity, created, rotated, revoked = row
    return WorkerRegistration(worker_id, tuple(labels or ()), tuple(projects or ()), int(capacity), int(created),
                              rotated, revoked)


class ClusterWorkers:
    def __init__(self, pool_factory: Callable[[], Awaitable[Any]]) -> None:
        self._pool_factory = pool_factory

    async def _one(self, sql: str, params: Sequence[Any], *, many: bool = False) -> Any:
        pool = await self._pool_factory()
        async with pool.connection() as conn:
            async with conn.transaction():
                cur = await conn.execute(sql, params)
                return await cur.fetchall() if many else await cur.fetchone()

    async def register_worker(self, registration: WorkerRegistration, digest: bytes) -> None:
        r = registration
        row = await self._one(_REGISTER, (r.worker_id, list(r.labels), list(r.projects), r.capacity,
                                          r.created_at_ms, bytes(digest)))
        if row is None:
            raise AlreadyExists(f"worker {quoted(r.worker_id)} is registered already (revoke it first, or rotate "
                                "its token)")

    async def rotate_worker(self, worker_id: str, digest: bytes, now_ms: int) -> WorkerRegistration:
        row = await self._one(_ROTATE, (bytes(digest), now_ms, worker_id))
        if row is None:
            raise NotFound(f"no registered worker {quoted(worker_id)}")
        return _registration(row)

    async def revoke_worker(self, worker_id: str) -> int:
        row = await self._one(_REVOKE, (worker_id,))
        if row is None or row[0] is None:
            raise NotFound(f"no registered worker {quoted(worker_id)}")
        return int(row[0])

    async def list_workers(self) -> Sequence[WorkerRegistration]:
        return [_registration(row) for row in await self._one(_LIST, (), many=True)]
