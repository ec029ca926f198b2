"""What the host may ask of a backend beyond ``SchedulerBackend`` is declared in
``qinglong.contracts.capabilities`` and found with ``isinstance``, never by probing names.

The built-in backends are checked against the protocols they offer, and a third party's backend
that offers none of them (a real plugin distribution, loaded by entry point) is driven through the
same host functions: each capability it lacks is refused with a message naming the command and
the profile, or is simply not used, exactly as documented in the capabilities module.
"""

from __future__ import annotations

import asyncio
import importlib
import os

import pytest

from qinglong.contracts.capabilities import (
    ExecutingBackend,
    LocalStoreSettings,
    MigratesAtStart,
    RemoteExecutionBackend,
    StatusReader,
    proposed_log_dir,
)
from qinglong.contracts.errors import UserError
from qinglong.contracts.execution import ExecutionStore, RunControl
from qinglong.contracts.store import BackendContext, SchedulerBackend, SchedulerLimits
from qinglong.host.cli import boot
from qinglong.host.cli.read import _scheduler_status
from qinglong.host.containers import build_container, dispatcher_factory, execution_log_dir
from qinglong.host.plugins import PluginHost
from qinglong.host.settings import load_settings


def _container(tmp_path, profile: str):
    settings = tmp_path / "s.toml"
    settings.write_text(f'profile = "{profile}"\n' + (
        f'[backend]\npath = "{tmp_path / "q.db"}"\n' if profile != "cluster" else ""))
    return build_container(load_settings(settings))


def test_the_edge_backend_offers_local_execution_migration_status_and_a_store_file(tmp_path):
    """If the SQLite backend stopped matching its protocols, the dispatcher would not start, the
    schema would not be migrated at start and ``schedules`` would hide lag, all silently."""
    container = _container(tmp_path, "edge")
    backend = container.backend()
    assert isinstance(backend, SchedulerBackend)
    assert isinstance(backend, ExecutingBackend) and isinstance(backend, MigratesAtStart)
    assert not isinstance(backend, RemoteExecutionBackend)
    assert isinstance(backend.reader(), StatusReader)
    assert isinstance(container.backend_settings(), LocalStoreSettings)
    assert isinstance(boot.execution_of(backend), ExecutionStore)
    assert boot.run_control_of(backend) is None
    assert execution_log_dir(container.loaded(), container.backend_settings()) == str(tmp_path / "q.db") + ".logs"


def test_the_cluster_backend_offers_remote_run_control_and_is_refused_local_execution(tmp_path):
    """The cluster's Runs are executed by remote workers: a local dispatcher on it would run every
    job a second time beside the workers, and ``task run`` must say why it cannot run here."""
    container = _container(tmp_path, "cluster")
    backend = container.backend()  # created, never connected
    assert isinstance(backend, RemoteExecutionBackend) and isinstance(backend, MigratesAtStart)
    assert not isinstance(backend, ExecutingBackend)
    assert not isinstance(container.backend_settings(), LocalStoreSettings)
    assert isinstance(boot.run_control_of(backend), RunControl)
    assert boot.need_runs(backend, container, "runs show") is not None
    with pytest.raises(UserError) as refused:
        boot.need_execution(backend, container, "task run")
    assert str(refused.value) == ("`task run` needs a profile that runs Runs locally (edge or standalone); "
                                  "the cluster profile's store does not execute them here")
    assert execution_log_dir(container.loaded(), container.backend_settings()) is None
    assert dispatcher_factory(None, container.loaded(), container.backend_settings(), None, None)(backend) is None


BARE_BACKEND = '''
from pydantic import BaseModel, ConfigDict

from qinglong.contracts.hookspecs import hookimpl
from qinglong.contracts.store import SchedulerBackendSpec


class BareSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    location: str = "memory"


class BareReader:
    async def list_projects(self, limit=None):
        return []

    async def list_triggers(self, project_id=None, limit=None):
        return []

    async def list_schedules(self, limit=None, after=None):
        return []

    async def recent_runs(self, limit=20, trigger_id=None):
        return []

    async def recent_skips(self, limit=20):
        return []


class BareBackend:
    """Implements SchedulerBackend and nothing else."""

    name = "acme_bare"

    def __init__(self, context):
        self.context = context
        self.calls = []

    async def open(self, *, create=True):
        self.calls.append("open")

    async def migrate(self):
        self.calls.append("migrate")
        return []

    async def migration_status(self):
        return []

    async def check_readiness(self):
        self.calls.append("check_readiness")

    async def recover(self):
        raise NotImplementedError

    async def run_round(self):
        raise NotImplementedError

    def publisher(self):
        raise NotImplementedError

    def reader(self):
        return BareReader()

    async def close(self):
        self.calls.append("close")


@hookimpl
def qinglong_scheduler_backends():
    return [SchedulerBackendSpec(name="acme_bare", settings_model=BareSettings, create=BareBackend)]
'''


@pytest.fixture
def bare(site, tmp_path, monkeypatch):
    """A third party's backend with no optional capability, created from its own plugin."""
    site.add_distribution("acme-bare", {"acme_bare.py": BARE_BACKEND}, {"bare": "acme_bare"})
    monkeypatch.syspath_prepend(str(site.root))
    monkeypatch.delitem(importlib.sys.modules, "acme_bare", raising=False)
    importlib.invalidate_caches()
    host = PluginHost()
    host.load(["bare"])
    spec = host.backend_specs()["acme_bare"]
    settings = spec.settings_model()
    backend = spec.create(BackendContext(settings, SchedulerLimits(32, 16, 30_000, 1000), {}, None,
                                         lambda: 0, "test"))
    return backend, settings


def test_a_backend_without_any_capability_is_refused_with_a_clear_message_and_never_probed(
        bare, tmp_path, monkeypatch):
    """A third party's backend that executes nothing must get no dispatcher (which would call a
    method it does not have), no migration it did not offer, no lag it cannot compute, and run
    commands must say plainly that the profile's store records no Runs instead of failing with an
    AttributeError traceback."""
    backend, settings = bare
    assert isinstance(backend, SchedulerBackend)
    for capability in (ExecutingBackend, RemoteExecutionBackend, MigratesAtStart):
        assert not isinstance(backend, capability), capability
    assert not isinstance(backend.reader(), StatusReader)
    assert not isinstance(settings, LocalStoreSettings) and proposed_log_dir(settings) is None
    assert boot.execution_of(backend) is None and boot.run_control_of(backend) is None
    edge = _container(tmp_path, "edge")
    with pytest.raises(UserError) as refused:
        boot.need_runs(backend, edge, "runs show")
    assert str(refused.value) == ("`runs show` needs a profile whose store records how Runs ran; "
                                  "the edge profile's store does not")
    assert dispatcher_factory(None, edge.loaded(), settings, None, None)(backend) is None
    assert asyncio.run(_scheduler_status(backend.reader())) is None

    class Opened:
        def backend(self):
            return backend

    async def opened() -> None:
        async with boot.opened_backend(Opened()) as same:
            assert same is backend

    asyncio.run(opened())
    assert backend.calls == ["open", "check_readiness", "close"]  # no migrate: not offered


def test_a_local_store_proposes_its_log_directory_beside_the_file(tmp_path, monkeypatch):
    """Attempt logs must follow the store file, absolute, so a job's working directory never
    changes where the control plane looks for them; a configured ``log_dir`` wins."""
    from qinglong.plugins.edge_sqlite.settings import EdgeSqliteSettings

    monkeypatch.chdir(tmp_path)
    assert proposed_log_dir(EdgeSqliteSettings(path="data/q.db")) == os.path.join(str(tmp_path), "data/q.db.logs")
    settings = tmp_path / "s.toml"
    settings.write_text('[execution]\nlog_dir = "elsewhere"\n[backend]\npath = "q.db"\n')
    container = build_container(load_settings(settings))
    assert execution_log_dir(container.loaded(), container.backend_settings()) == str(tmp_path / "elsewhere")
