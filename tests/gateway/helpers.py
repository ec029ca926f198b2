"""The worker gateway under test: the shared support in :mod:`tests.support.gateway`, re-exported
under the names these tests have always used."""

from __future__ import annotations

from tests.support.gateway import (  # noqa: F401
    ApiGateway,
    GatewayPlane,
    WorkerHttp,
    child_env,
    cli,
    plane_settings,
    register,
    start_gateway_worker,
    write_gateway_worker_settings,
)
