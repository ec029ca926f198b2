"""An incoming event's payload reaches the job on a cluster worker: admitted with the Run, carried
by the worker's claim, written by the worker into the job's directory (0600) and named in the
job's environment, as the local executor does on the edge."""

from __future__ import annotations

import asyncio
import json

from tests.worker.helpers import (
    PROJECT,
    attempts,
    publish_task,
    py_job,
    start_worker,
    stored_log,
    wait_run_state,
)

#: The job prints the file its environment names, its mode, and whether it is in its own dir.
READER = (
    "import os, stat\n"
    "path = os.environ['QINGLONG_EVENT_FILE']\n"
    "print(open(path).read())\n"
    "print(oct(stat.S_IMODE(os.stat(path).st_mode)))\n"
    "print(os.path.basename(os.path.dirname(path)) == os.environ['QINGLONG_ATTEMPT_ID'])\n"
)
SECRET = "0123456789abcdef0123456789abcdef"


def admit_event(db, trigger_id: str, event_id: str, payload: dict) -> str:
    """Admit through the store's one event-source contract function, as the hook route does."""

    async def body():
        backend = db.backend("event-source")
        try:
            await backend.open()
            result = await backend.occurrences().admit_occurrence("hook", trigger_id, event_id,
                                                                  payload, db.db_now_ms())
            assert result.created, result
            return result.run_id
        finally:
            await backend.close()

    return asyncio.run(body())


def publisher_with_hooks(db):
    """A backend whose publisher knows the ``hook`` kind (the chain plugin's provider)."""
    import time

    from qinglong.contracts.store import BackendContext, SchedulerLimits
    from qinglong.plugins.chain import HookProvider
    from qinglong.plugins.cluster_postgres import qinglong_scheduler_backends
    from qinglong.plugins.cron.provider import CronProvider
    from tests.support.cluster import CollectingSink

    context = BackendContext(
        settings=db.settings(), limits=SchedulerLimits(page_size=32, claim_budget=16,
                                                       lease_ms=30_000, cadence_ms=1000),
        providers={"cron": CronProvider(), "hook": HookProvider()}, diagnostics=CollectingSink(),
        clock_ms=lambda: int(time.time() * 1000), owner="publisher")
    return qinglong_scheduler_backends()[0].create(context)


def test_a_hook_body_reaches_the_job_of_a_cluster_worker_as_a_private_file(cluster, tmp_path, worker_gateway):
    """Without the payload in the claim, a webhook-started job on the cluster would run blind
    (the deploy would not know which ref was pushed); written world-readable, another local
    user could read a body that may carry tokens."""
    from qinglong.contracts.records import TriggerDefinition

    publish_task(cluster, "deploy", {"command": py_job(READER), "timeout_ms": 60_000})

    async def hook_trigger():
        backend = publisher_with_hooks(cluster)
        try:
            await backend.publisher().put_trigger(TriggerDefinition(
                PROJECT, "deploy-hook", "deploy", "hook", {"secret": SECRET}))
        finally:
            await backend.close()

    asyncio.run(hook_trigger())
    payload = {"body": '{"ref": "main"}', "content_type": "application/json",
               "delivery": "push-1"}
    run_id = admit_event(cluster, "deploy-hook", "push-1", payload)
    worker = start_worker(worker_gateway, tmp_path, "w-hook")
    try:
        assert wait_run_state(cluster, run_id) == "succeeded"
        (attempt,) = attempts(cluster, run_id)
        lines = stored_log(cluster, attempt["attempt_id"]).decode().splitlines()
        assert json.loads(lines[0]) == payload
        assert lines[1:] == ["0o600", "True"]
    finally:
        worker.stop()
