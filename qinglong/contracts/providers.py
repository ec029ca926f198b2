"""The trigger-provider protocol: how a trigger kind turns a spec into occurrences.

A provider is profile-neutral and pure: it never reads a clock, a database or the network. The host
collects providers from the ``qinglong_trigger_providers`` hook; cron is the built-in one and third
parties add kinds (``interval`` in ``examples/interval-trigger``) the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from .frozen import record


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


@runtime_checkable
class OffersExampleSpec(Protocol):
    """A provider that can write an example spec of its kind, for ``qinglong demo``.

    Optional: the demo asks each loaded provider (by kind, in name order) and publishes the first
    example it gets, so the host never writes a kind's spec itself.
    """

    def example_spec(self, every_ms: int) -> Mapping[str, Any] | None:
        """A normalised spec firing every ``every_ms`` milliseconds (at multiples of it since the
        epoch), or None when this kind cannot express that period. Validating it must return it
        unchanged."""
        ...


def fire_times(schedule: Any, spec: Mapping[str, Any], after_ms: int, count: int) -> list[int]:
    """The next ``count`` fire times after ``after_ms`` of a checked ``spec``, fewer where the
    schedule ends: ``schedule`` is a provider, or anything answering ``next_after`` as one does
    (a jittered schedule). One loop for every preview (``cron next``, the API)."""
    times: list[int] = []
    cursor = after_ms
    while len(times) < count:
        nxt = schedule.next_after(spec, cursor)
        if nxt is None:
            break
        times.append(nxt)
        cursor = nxt
    return times


@record(slots=False)
class TriggerCliOption:
    """One command-line option a trigger kind adds to ``qinglong trigger add`` and ``update``.

    ``flag`` is the long option (``--every``); the value always arrives as text, and only the
    options the operator gave are passed to :attr:`TriggerCliOptions.to_spec`, keyed by
    :attr:`name` (``--grace-period`` -> ``grace_period``). Two kinds may declare the same flag
    (``--timezone``); the CLI then adds it once and hands it to the kind the command is about.
    """

    flag: str
    help: str
    metavar: str = "VALUE"

    @property
    def name(self) -> str:
        """The key of this option's value in the mapping ``to_spec`` receives."""
        return self.flag.lstrip("-").replace("-", "_")


@record(slots=False)
class TriggerCliOptions:
    """How operators write a trigger of one kind on the command line, instead of ``--spec JSON``.

    ``to_spec(given, current)`` turns the given options (name -> text) into a spec, which the
    publisher then validates with the kind's provider as any other spec. ``current`` is the stored
    spec when ``trigger update`` changes a trigger of this same kind (so ``--timezone`` alone can
    keep the expression), and None otherwise. Raise
    :class:`~qinglong.contracts.errors.UserError` (or ``TriggerSpecError``) naming the option for
    input that cannot become a spec. ``usage`` is the short form shown when a new trigger has no
    schedule (``--every DURATION [--anchor-ms MS]``).
    """

    kind: str
    options: tuple[TriggerCliOption, ...]
    to_spec: Callable[[Mapping[str, str], "Mapping[str, Any] | None"], Mapping[str, Any]]
    usage: str = ""

    def flags(self) -> tuple[str, ...]:
        """The flags of this kind, in declaration order."""
        return tuple(option.flag for option in self.options)
