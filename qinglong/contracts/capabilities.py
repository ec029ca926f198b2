"""Optional capabilities of a backend: what the host may ask beyond :class:`~.store.SchedulerBackend`.

A scheduler backend must implement :class:`~.store.SchedulerBackend`. Everything else the host
uses is one of these protocols, checked with ``isinstance`` where it is needed, so a third-party
backend author reads here exactly what the host may ask of an object and what it does without:

* :class:`ExecutingBackend` (the backend's ``execution()``): this host executes its Runs. Without
  it: no local dispatcher, and the run commands use :class:`RemoteExecutionBackend`.
* :class:`RemoteExecutionBackend` (the backend's ``run_control()``): its Runs are executed
  elsewhere and read or cancelled from here. Without either: ``runs show``, ``runs cancel`` and
  ``logs`` are refused naming the profile. :func:`runs_of` picks the one a backend offers, for
  the run commands and the status page alike.
* :class:`EventingBackend` (the backend's ``outbox()``): its store writes events out (an outbox)
  and ``qinglong run`` delivers them to the configured channels. Without it: no notifications.
* :class:`AdmitsOccurrences` (the backend's ``occurrences()``): event sources (``at_start``, a
  plugin's) may admit Runs. Without it: no event source is started.
* :class:`MigratesAtStart` (the backend's ``auto_migrate``): without it the host never migrates
  at start, and the operator runs ``qinglong db migrate``.
* :class:`StatusReader` (the reader's ``scheduler_status()``): without it ``qinglong schedules``
  shows no lag, since it cannot tell whether a scheduler runs.
* :class:`LocalStoreSettings` (the validated ``[backend]`` settings' ``path``): the store is a
  file here, and its Attempt directories go beside it. Without it, ``[execution] log_dir`` or
  ``./qinglong.logs``.

The protocols are ``runtime_checkable``: ``isinstance`` looks only for the names, so the types
and the docstrings here are the promise an implementation keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # types only
    from .event_sources import OccurrenceAdmission
    from .events import EventOutbox
    from .execution import ExecutionStore, RunControl
    from .records import SchedulerStatus
    from .tokens import TokenStore


@runtime_checkable
class ExecutingBackend(Protocol):
    """A backend whose Runs this host executes itself (edge, standalone).

    ``qinglong run`` starts the local dispatcher on :meth:`execution` when ``[execution] enabled``;
    ``runs``, ``runs show``, ``runs cancel``, ``logs`` and ``task run`` read and change Runs through
    it.
    """

    def execution(self) -> "ExecutionStore | None":
        """The store's :class:`~qinglong.contracts.execution.ExecutionStore`, on the backend's
        connection; None when this instance does not execute Runs here after all."""
        ...


@runtime_checkable
class RemoteExecutionBackend(Protocol):
    """A backend whose Runs are executed elsewhere (the cluster's remote workers), read and
    cancelled from here."""

    def run_control(self) -> "RunControl | None":
        """The store's :class:`~qinglong.contracts.execution.RunControl`, or None."""
        ...


@runtime_checkable
class EventingBackend(Protocol):
    """A backend whose store writes an event in the transaction that ends a Run or skips a
    trigger's occurrences (:mod:`qinglong.contracts.events`)."""

    def outbox(self) -> "EventOutbox | None":
        """The store's :class:`~qinglong.contracts.events.EventOutbox`, or None."""
        ...


@runtime_checkable
class AdmitsOccurrences(Protocol):
    """A backend whose store admits event sources' occurrences
    (:mod:`qinglong.contracts.event_sources`)."""

    def occurrences(self) -> "OccurrenceAdmission | None":
        """The store's :class:`~qinglong.contracts.event_sources.OccurrenceAdmission`, or None."""
        ...


@runtime_checkable
class TokenBackend(Protocol):
    """A backend that keeps the management API's tokens and its audit log."""

    def tokens(self) -> "TokenStore":
        """The store's :class:`~qinglong.contracts.tokens.TokenStore`."""
        ...


@runtime_checkable
class MigratesAtStart(Protocol):
    """A backend that may apply its pending migrations when it starts.

    ``qinglong run`` and the commands that open a store ready calls ``migrate()`` before
    ``check_readiness()`` when ``auto_migrate`` is true (usually the ``[backend] auto_migrate``
    setting).
    """

    auto_migrate: bool


@runtime_checkable
class StatusReader(Protocol):
    """A reader that can tell whether a scheduler works its store now, so ``qinglong schedules``
    shows lag only while one runs."""

    async def scheduler_status(self) -> "SchedulerStatus":
        """Whether a scheduler is working this store now (see
        :class:`~qinglong.contracts.records.SchedulerStatus`)."""
        ...


@runtime_checkable
class LocalStoreSettings(Protocol):
    """Validated ``[backend]`` settings of a store kept in one file on this host (SQLite).

    ``qinglong status`` shows ``path`` as where the store is, and unless ``[execution] log_dir``
    is set the backend proposes ``<resolved path>.logs`` beside the file for the Attempt
    directories (logs and receipts), so a store and its logs move together.
    """

    path: str


def runs_of(backend: object) -> "ExecutionStore | RunControl | None":
    """What reads a backend's Runs with ``list_runs`` and ``run_detail`` (state, exit code,
    duration, reason): its execution store where this host executes them
    (:class:`ExecutingBackend`), else its run control where they are executed elsewhere
    (:class:`RemoteExecutionBackend`); None with neither. The run commands and the status page
    both read Runs through it."""
    store = backend.execution() if isinstance(backend, ExecutingBackend) else None
    if store is not None:
        return store
    return backend.run_control() if isinstance(backend, RemoteExecutionBackend) else None


def proposed_log_dir(settings: object) -> str | None:
    """The Attempt directory a backend's settings propose: ``<resolved path>.logs`` for
    :class:`LocalStoreSettings` with a non-empty ``path``, else None. Resolved through symlinks,
    like the store's lock and secrets key, so every name of one file logs into one directory,
    the one its retention sweeps."""
    import os

    if not isinstance(settings, LocalStoreSettings):
        return None
    path = settings.path
    if not isinstance(path, str) or not path:
        return None
    return os.path.realpath(path) + ".logs"


__all__ = [
    "AdmitsOccurrences",
    "EventingBackend",
    "ExecutingBackend",
    "LocalStoreSettings",
    "MigratesAtStart",
    "RemoteExecutionBackend",
    "StatusReader",
    "proposed_log_dir",
    "runs_of",
]
