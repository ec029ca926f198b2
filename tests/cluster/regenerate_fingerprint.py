"""Regenerate the shipped catalog fingerprint from a fresh server with every migration applied.

    python tests/cluster/regenerate_fingerprint.py [--server pg18|pg15] [--check]

Starts a throw-away PostgreSQL server through the test harness (``tests/support/pg.py``), creates the
four roles and a database exactly as ``docs/cluster.md`` says, applies every shipped migration
through the backend (as the owner role), reads the fingerprint as the runtime role (as readiness
does) and rewrites ``qinglong/plugins/cluster_postgres/expected_fingerprint.py``. Prints the lines
added and removed. ``--check`` writes nothing and exits 1 when the shipped file is stale.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.pg import PgServer, create_database, create_roles, drop_database, start_server  # noqa: E402

TARGET = ROOT / "qinglong" / "plugins" / "cluster_postgres" / "expected_fingerprint.py"
DBNAME = "ql_fingerprint"


async def fresh_fingerprint(server: PgServer, dbname: str = DBNAME) -> list[str]:
    """Create ``dbname`` on ``server`` (roles created if needed), migrate it, and return its
    fingerprint as read by the runtime role on a plugin session."""
    from tests.support.cluster import ClusterDb
    from qinglong.plugins.cluster_postgres import fingerprint

    create_roles(server)
    create_database(server, dbname)
    db = ClusterDb(server, dbname)
    backend = db.backend("fingerprint")
    try:
        await backend.migrate()
        pool = await backend.runtime_pool()
        async with pool.connection() as conn:
            return await fingerprint.collect(conn, backend.settings.roles())
    finally:
        await backend.close()
        drop_database(server, dbname)


def main(argv: list[str] | None = None) -> int:
    from qinglong.plugins.cluster_postgres import fingerprint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="pg18", choices=("pg18", "pg15"))
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    args = parser.parse_args(argv)

    server = start_server(args.server)
    try:
        lines = asyncio.run(fresh_fingerprint(server))
    finally:
        server.destroy()
    shipped = set(fingerprint.expected())
    for line in sorted(set(lines) - shipped):
        print(f"+ {line}")
    for line in sorted(shipped - set(lines)):
        print(f"- {line}")
    if args.check:
        return 1 if set(lines) != shipped else 0
    TARGET.write_text(fingerprint.render_module(lines), encoding="utf-8")
    print(f"wrote {len(set(lines))} lines to {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
