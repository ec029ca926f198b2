"""``qinglong run`` and ``qinglong demo``."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, Mapping

from qinglong.contracts.errors import AlreadyExists, ExitCode, SettingsError
from qinglong.contracts.records import TriggerDefinition

from .boot import container_of, on_backend
from .parsing import add_command, positive_count, seconds_up_to
from .signals import run_lifecycle


def cmd_run(args: argparse.Namespace) -> int:
    """Start the profile's lifecycle and run until SIGTERM/SIGINT (or ``--for-seconds``)."""
    container = container_of(args)
    refuse_gateway_setting(container.loaded())
    lifecycle = container.lifecycle()
    return asyncio.run(run_lifecycle(lifecycle, container.diagnostics(), args.for_seconds))


def refuse_gateway_setting(loaded: Any) -> None:
    """``[api] gateway_dsn`` on a profile whose store has no worker gateway is refused, as
    ``qinglong api`` refuses it, rather than read and ignored (its workers would wait forever).
    A profile with remote workers (its ``[worker]`` table) may set it: ``qinglong api`` and
    ``qinglong run`` may share one file there."""
    if loaded.settings.api.gateway_dsn is None or loaded.profile.worker_forbidden_modules:
        return
    raise SettingsError(f"invalid settings: {loaded.origin(('api', 'gateway_dsn'))}: key 'api.gateway_dsn': "
                        f"the {loaded.profile.name} profile's store offers no worker gateway (use the cluster "
                        "profile)")


#: The longest ``run --for-seconds`` (a year) and ``demo --seconds`` (an hour) accepted.
MAX_RUN_SECONDS = 366 * 86_400
MAX_DEMO_SECONDS = 3_600


#: What the demo task runs: a shell only because the demo asks for one (``sh -c``).
DEMO_COMMAND = ("sh", "-c", 'echo "hello from qinglong: run $QINGLONG_RUN_ID, attempt $QINGLONG_ATTEMPT"')


#: The demo trigger's period.
DEMO_EVERY_MS = 1000


def demo_trigger(providers: Mapping[str, Any]) -> tuple[str, Mapping[str, Any], str]:
    """``(kind, spec, description)`` of a trigger firing every :data:`DEMO_EVERY_MS`: the first
    example a loaded provider offers (:class:`~qinglong.contracts.providers.OffersExampleSpec`),
    asking the kinds in name order; the host writes no kind's spec itself."""
    from qinglong.contracts.errors import UserError
    from qinglong.contracts.providers import OffersExampleSpec

    for kind in sorted(providers):
        provider = providers[kind]
        if isinstance(provider, OffersExampleSpec):
            spec = provider.example_spec(DEMO_EVERY_MS)
            if spec is not None:
                return kind, spec, provider.describe(spec)
    raise UserError(f"no loaded trigger kind offers an example firing every {DEMO_EVERY_MS} ms for the "
                    f"demo (loaded kinds: {', '.join(sorted(providers)) or 'none'})")


def refuse_demo_without_execution(loaded: Any) -> None:
    """``[execution] enabled = false`` on a profile whose Runs only this process runs: the demo
    would publish, then wait out its whole grace for a Run that cannot start. Refused before
    anything is written. A profile with remote workers leaves the Runs to them."""
    if loaded.settings.execution.enabled or loaded.profile.worker_forbidden_modules:
        return
    raise SettingsError(f"invalid settings: {loaded.origin(('execution', 'enabled'))}: key 'execution.enabled': "
                        f"false, so no Run of the demo can start (the {loaded.profile.name} profile runs its "
                        "Runs in this process only); set it to true, or leave it out, to run the demo")


def cmd_demo(args: argparse.Namespace) -> int:
    """Publish a demo trigger firing every second, run for a few seconds, show the Runs and what
    the last one printed."""
    from qinglong.contracts.execution import parse_execution_spec, spec_to_payload

    from .task import execution_limits

    container = container_of(args)
    refuse_demo_without_execution(container.loaded())
    payload = spec_to_payload(parse_execution_spec(
        "hello", {"command": list(DEMO_COMMAND), "timeout_ms": 60_000}, execution_limits(container.loaded())))
    kind, spec, description = demo_trigger(container.trigger_providers())

    async def publish(backend: Any) -> None:
        pub = backend.publisher()
        try:
            await pub.create_project("demo", "Demo project")
        except AlreadyExists:
            pass
        await pub.put_task("demo", "hello", payload)
        await pub.put_trigger(TriggerDefinition(
            project_id="demo", trigger_id="demo-every-second", task_id="hello", kind=kind, spec=spec,
        ))

    on_backend(container, publish, create=True)
    print(f"published trigger demo-every-second ({description}) running {DEMO_COMMAND[0]} -c '...'; "
          f"running for {args.seconds:g} s ...", flush=True)
    from .runs import a_run_has_ended, show_demo_runs

    async def shown_run_has_ended() -> bool:  # the lifecycle's own open backend
        return await a_run_has_ended(container.backend(), project="demo", task="hello", limit=args.limit)

    code = asyncio.run(run_lifecycle(container.lifecycle(), container.diagnostics(), args.seconds,
                                     until=shown_run_has_ended))
    if code != ExitCode.OK:
        return code

    return show_demo_runs(container, project="demo", task="hello", trigger="demo-every-second", limit=args.limit)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``run`` and ``demo``."""
    p = add_command(sub, common, "run", "run the scheduler until SIGTERM/SIGINT (a second signal forces the exit)",
                    cmd_run)
    p.add_argument("--for-seconds", type=seconds_up_to(MAX_RUN_SECONDS), default=None, metavar="S",
                   help=f"stop by itself after S seconds (more than 0, at most {MAX_RUN_SECONDS:,})")

    p = add_command(sub, common, "demo", "publish a trigger firing every second, run a few seconds, show its Runs",
                    cmd_demo)
    p.add_argument("--seconds", type=seconds_up_to(MAX_DEMO_SECONDS), default=5.0,
                   help=f"how long to run (default 5, at most {MAX_DEMO_SECONDS:,})")
    p.add_argument("--limit", type=positive_count, default=10, help="Runs to show (default 10)")
