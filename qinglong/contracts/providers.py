"""The trigger-provider protocol: how a trigger kind turns a spec into occurrences.

A provider is profile-neutral and pure: it never reads a clock, a database or the network. The host
collects providers from the ``qinglong_trigger_providers`` hook; cron is the built-in one and third
parties add kinds (``interval`` in ``examples/interval-trigger``) the same way.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable


@runtime_checkable
class TriggerProvider(Protocol):
    """One trigger kind.

    ``kind`` is the name operators write (``cron``); it must be unique among loaded plugins.
    """

    kind: str

    def validate(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        """Return the normalised spec, or raise :class:`~qinglong.contracts.errors.TriggerSpecError`.

        Called by the publisher before any write. The result is stored and is what
        :meth:`next_after` and :meth:`latest_at_or_before` later receive. It must be JSON-serialisable
        and validating it again must return it unchanged.
        """
        ...

    def next_after(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        """The first occurrence strictly after ``after_ms`` (epoch ms), or None if there is none."""
        ...

    def latest_at_or_before(self, spec: Mapping[str, Any], at_ms: int) -> int | None:
        """The last occurrence at or before ``at_ms`` (epoch ms), or None if there is none.

        Lets a ``fire_once`` misfire find the latest due occurrence without walking the backlog.
        """
        ...

    def describe(self, spec: Mapping[str, Any]) -> str:
        """A one-line human summary of a normalised spec, for ``qinglong schedules``."""
        ...
