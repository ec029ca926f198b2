"""The ``cluster_postgres`` plugin: many replicas sharing one PostgreSQL, row leases, no leader.

Loaded only by the ``cluster`` profile, through its entry point. This module imports nothing
heavy: the settings model is pydantic only, and psycopg is imported when the host calls the
factory. The package holds one module per concept:

* ``settings``: the ``[backend]`` section;
* ``migrations`` (+ ``migrations/NNNN_*.sql``) and ``roles``: the schema stream and exact grants,
  both verified at readiness;
* ``sql`` (+ ``sql/*.sql``): named SQL blocks;
* ``claim``: the one-statement ``SKIP LOCKED`` claim; ``admission``: the SERIALIZABLE admit;
  ``coordinator``: one bounded round;
* ``publisher``, ``reader``, ``recovery`` and ``backend`` (the ``SchedulerBackend``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qinglong.contracts.hookspecs import hookimpl

from .settings import ClusterPostgresSettings

if TYPE_CHECKING:  # a worker loads this plugin without the store's contracts
    from qinglong.contracts.store import BackendContext, SchedulerBackend

BACKEND_NAME = "cluster_postgres"


def create_backend(context: BackendContext) -> SchedulerBackend:
    """Build the backend without connecting; psycopg is imported here, not at plugin load."""
    from .backend import ClusterPostgresBackend

    return ClusterPostgresBackend(context)


@hookimpl
def qinglong_scheduler_backends():
    """Offer the ``cluster_postgres`` scheduler backend."""
    from qinglong.contracts.store import SchedulerBackendSpec

    return [
        SchedulerBackendSpec(
            name=BACKEND_NAME,
            settings_model=ClusterPostgresSettings,
            create=create_backend,
            description="PostgreSQL 15+: row-lease claims (SKIP LOCKED), SERIALIZABLE admission, no leader",
        )
    ]


async def create_worker_gateway(dsn: str, application_name: str, pool_size: int, *, backend_settings=None):
    """The API tier's gateway: the worker protocol on a small pool as the gateway's role
    (``backend_settings``: the ``[backend]`` section, which names that role)."""
    from .gateway import create_worker_gateway as create

    if isinstance(backend_settings, ClusterPostgresSettings):
        return await create(dsn, application_name, pool_size, gateway_role=backend_settings.gateway_role)
    return await create(dsn, application_name, pool_size)


@hookimpl
def qinglong_worker_protocols():
    """Offer the worker gateway of this store: SECURITY DEFINER functions, nothing else."""
    from qinglong.contracts.worker import WorkerProtocolSpec

    return [
        WorkerProtocolSpec(
            name=BACKEND_NAME,
            create_gateway=create_worker_gateway,
            description="PostgreSQL functions executed as the gateway role (no table privilege)",
        )
    ]



@hookimpl
def qinglong_lifecycle_components(context):
    """The control plane's work on the workers' Attempts, in every replica of this backend:
    lease expiry and the timeout double check (``control.ExpiryLoop``), log and skip retention
    (``control.LogRetention``, ``control.SkipRetention``) and the watch on Runs no worker can take
    (``control.StrandedRunsWatch``). Nothing for another profile's backend."""
    if getattr(context.backend, "name", None) != BACKEND_NAME:
        return []
    from .backend import ClusterPostgresBackend

    if not isinstance(context.backend, ClusterPostgresBackend):
        return []
    from .control import control_components

    return control_components(context.backend, context.settings)
