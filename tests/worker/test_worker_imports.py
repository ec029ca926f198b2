"""What ``qinglong worker`` on the gateway's path imports: none of the control plane's parts.

An idle worker's memory is mostly its imports; these modules serve the control plane (its
containers and loops, the store's contracts, the HTTP server, other commands, the store drivers)
and must stay out of the worker's process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: modules (and their submodules) the gateway worker never needs
HEAVY = (
    "qinglong.host.containers", "qinglong.host.lifecycle", "qinglong.host.readiness",
    "qinglong.host.waiting", "qinglong.host.execution", "qinglong.host.http", "qinglong.host.remote",
    "qinglong.host.views", "qinglong.host.events", "qinglong.host.closure",
    "qinglong.contracts.store", "qinglong.contracts.records", "qinglong.contracts.observe",
    "qinglong.contracts.apply", "qinglong.contracts.decision", "qinglong.contracts.events",
    "qinglong.host.cli.run", "qinglong.host.cli.publish", "qinglong.host.cli.apply",
    "qinglong.host.cli.runs", "qinglong.host.cli.read", "qinglong.host.cli.api",
    "qinglong.host.cli.tokens", "qinglong.host.cli.status", "qinglong.host.cli.db",
    "qinglong.host.cli.extensions",
    "qinglong.plugins.cluster_postgres.backend", "qinglong.plugins.cluster_postgres.gateway",
    "qinglong.plugins.cluster_postgres.worker_client", "qinglong.plugins.cron.provider",
    "qinglong.plugins.notify.webhook", "qinglong.plugins.edge_sqlite",
    "psycopg", "psycopg_pool", "aiosqlite", "sqlite3", "croniter", "uvicorn",
)

# The real entry (``main``, the dispatch, ``cmd_worker``) up to the moment the worker would
# connect: ``serve`` is replaced by one that imports what the real one does and lists modules.
PROBE = """
import json, sys
from qinglong.host.cli import worker as command

async def serve(connect, executors, config, diagnostics):
    from qinglong.host.assembly import release_freed_memory
    from qinglong.worker import Worker, connect_http_protocol
    release_freed_memory()
    print(json.dumps(sorted(sys.modules)))
    return 0

command.serve = serve
from qinglong.host.cli.main import main
sys.exit(main(["worker", "--settings", sys.argv[1]]))
"""


def test_the_gateway_worker_imports_none_of_the_control_planes_modules(tmp_path):
    token = tmp_path / "worker.token"
    token.write_text("qlw_" + "x" * 40 + "\n")
    token.chmod(0o600)
    settings = tmp_path / "worker.toml"
    settings.write_text('profile = "cluster"\n[worker]\nurl = "http://127.0.0.1:9"\n'
                        f'token_file = "{token}"\nworker_id = "imports-1"\nlog_dir = "{tmp_path / "logs"}"\n')
    settings.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    done = subprocess.run([sys.executable, "-c", PROBE, str(settings)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "qinglong.worker.runtime" in modules and "qinglong.plugins.local_process.executor" in modules
    loaded = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert loaded == []
