"""Export then apply round-trips: a property over generated configurations, on a real SQLite store.

For any configuration applied to a store, applying its export (masked: env values as
``stored:``) changes nothing, and applying its export with secrets to a new store gives the same
digests: the file format carries every part of a task and trigger revision. Were it to lose one
(a key, a default, an env value, a trigger field), a team keeping its jobs in git would publish
a new revision (and reset every schedule) on each apply, or run other commands than it exported.
"""

from __future__ import annotations

import asyncio
import string
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from qinglong.contracts.execution import ExecutionLimits
from qinglong.contracts.store import BackendContext, SchedulerLimits
from qinglong.host.cli.parsing import parse_duration_ms, parse_size_bytes
from qinglong.host.config.apply import ApplyOptions, apply_projects
from qinglong.host.config.document import EnvSources, load_document
from qinglong.host.config.render import export_projects
from qinglong.plugins.cron.provider import CronProvider
from tests.support.aio import closing

LIMITS = ExecutionLimits(max_log_limit_bytes=4 * 1024 * 1024)
IDS = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=8)
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
EXPRESSIONS = st.sampled_from(["* * * * *", "*/5 * * * *", "30 2 * * 1-5", "0 0 1 * *", "@daily",
                               "*/10 * * * * *", "0 30 9 * * mon"])
ZONES = st.sampled_from(["UTC", "Europe/Berlin", "Asia/Shanghai", "America/New_York"])


@st.composite
def tasks(draw):
    table: dict = {"command": draw(st.lists(TEXT.filter(bool), min_size=1, max_size=3))}
    if draw(st.booleans()):
        table["env"] = draw(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True)
                                            .filter(lambda n: not n.startswith("QINGLONG_")),
                                            TEXT.map(lambda v: {"value": v}), max_size=3))
    if draw(st.booleans()):
        table["timeout_ms"] = draw(st.integers(1_000, 86_400_000))
    if draw(st.booleans()):
        table["concurrency"] = draw(st.sampled_from(["allow", "forbid", "replace", "queue",
                                                     {"mode": "allow", "max_running": 3}]))
    if draw(st.booleans()):
        table["retry"] = {"max_attempts": draw(st.integers(1, 5)),
                          "jitter": draw(st.sampled_from([0, 0.25, 1.0]))}
    if draw(st.booleans()):
        table["labels"] = draw(st.lists(st.from_regex(r"[a-z][a-z0-9=]{0,5}", fullmatch=True), max_size=3))
    if draw(st.booleans()):
        table["description"] = draw(TEXT)
    if draw(st.booleans()):
        table["payload"] = draw(st.dictionaries(IDS, st.one_of(TEXT, st.integers(-5, 5), st.booleans(),
                                                               st.lists(st.integers(0, 3), max_size=2)),
                                                max_size=2))
    table["idempotent"] = draw(st.booleans())
    return table


@st.composite
def documents(draw):
    projects = {}
    trigger_n = 0
    for project_id in draw(st.lists(IDS, min_size=1, max_size=2, unique=True)):
        task_tables = draw(st.dictionaries(IDS, tasks(), min_size=1, max_size=3))
        triggers = {}
        for _ in range(draw(st.integers(0, 3))):
            trigger_n += 1
            triggers[f"t{trigger_n}"] = {
                "task": draw(st.sampled_from(sorted(task_tables))), "kind": "cron",
                "spec": {"expression": draw(EXPRESSIONS), "timezone": draw(ZONES)},
                "misfire_policy": draw(st.sampled_from(["fire_once", "skip"])),
                "misfire_grace_ms": draw(st.integers(5_000, 3_600_000)), "enabled": draw(st.booleans())}
            jitter = draw(st.sampled_from([0, 0, 1, 300_000, 86_400_000]) | st.integers(0, 86_400_000))
            if jitter or draw(st.booleans()):  # 0 written or left out: the same trigger
                triggers[f"t{trigger_n}"]["jitter_ms"] = jitter
        project = {"tasks": task_tables, "triggers": triggers}
        if draw(st.booleans()):
            project["name"] = draw(TEXT.filter(lambda s: s and s.isprintable()))
        projects[project_id] = project
    return {"version": 1, "projects": projects}


def _backend(path: Path):
    from qinglong.plugins.edge_sqlite import EdgeSqliteSettings, create_backend

    class Sink:
        def emit(self, event):
            pass

    return create_backend(BackendContext(
        settings=EdgeSqliteSettings(path=str(path)),
        limits=SchedulerLimits(page_size=32, claim_budget=16, lease_ms=4000, cadence_ms=1000),
        providers={"cron": CronProvider()}, diagnostics=Sink(), clock_ms=lambda: 1_700_000_000_000,
        owner="round-trip"))


def _load(text_or_data, *, inline: bool):
    sources = EnvSources(environ={}, allow_inline=inline)
    if isinstance(text_or_data, str):
        return load_document(text_or_data, "exported.toml", sources, LIMITS,
                             parse_duration=parse_duration_ms, parse_size=parse_size_bytes)
    return load_document("", "generated", sources, LIMITS, parse_duration=parse_duration_ms,
                         parse_size=parse_size_bytes, data=text_or_data)


async def _apply_and_read(path: Path, document) -> tuple[dict, str, str]:
    backend = _backend(path)
    await backend.open()
    await backend.migrate()
    async with closing(backend):
        await apply_projects(backend, document.projects, ApplyOptions(), refusal=document.refusal)
        publisher = backend.publisher()
        states = [await publisher.project_state(p.project_id) for p in await backend.reader().list_projects()]
    seen = {s.project_id: (s.name,
                           {k: (v.task_revision, v.content_digest) for k, v in s.tasks.items()},
                           {k: (v.trigger_revision, v.content_digest) for k, v in s.triggers.items()})
            for s in states}
    return seen, export_projects(states, with_secrets=False), export_projects(states, with_secrets=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_export_then_apply_gives_identical_revisions_and_digests(data):
    with tempfile.TemporaryDirectory() as tmp:
        first = Path(tmp) / "first.db"
        applied, masked, with_secrets = asyncio.run(_apply_and_read(first, _load(data, inline=True)))
        again, masked_again, _ = asyncio.run(_apply_and_read(first, _load(masked, inline=False)))
        assert again == applied
        assert masked_again == masked
        fresh, _, with_secrets_again = asyncio.run(_apply_and_read(Path(tmp) / "fresh.db",
                                                                   _load(with_secrets, inline=True)))
        assert fresh == applied
        assert with_secrets_again == with_secrets
