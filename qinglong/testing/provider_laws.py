"""The laws every trigger provider keeps, as functions a plugin's own tests call with its provider.

The scheduler trusts a provider blindly: both backends store what ``validate`` returns, move a
cursor to ``next_after`` and admit ``latest_at_or_before`` on a ``fire_once`` misfire. A provider
that breaks a law loses or duplicates Runs in every profile, so these checks are the contract a
kind must pass before it ships:

* **validate is idempotent**: :func:`check_validate_idempotent`. The normalised spec validates to
  itself, is JSON that round-trips, and the input is not mutated (a new revision on every
  republish would reset the schedule each time).
* **purity**: :func:`check_purity`. The same spec and instant give the same answers on every call,
  from a copy of the spec and from a fresh provider (replicas must agree; no clock, no state).
* **next_after is strictly increasing**: :func:`check_next_after`.
* **next_after and latest_at_or_before describe the same occurrences**: :func:`check_agreement`.
* **an example spec fires at its period**: :func:`check_example_spec`, for providers that offer
  ``example_spec`` (what ``qinglong demo`` publishes).

:func:`check_provider_laws` runs them all for one spec and instant; :func:`provider_law_test`
builds a hypothesis test over generated specs and instants (``pip install 'qinglong[testing]'``).
Each check raises :class:`LawViolation` (an ``AssertionError``) naming the kind, the law, the spec
and the instant.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, Mapping

from qinglong.contracts.errors import TriggerSpecError
from qinglong.contracts.providers import OffersExampleSpec, TriggerProvider


class LawViolation(AssertionError):
    """A trigger provider broke one of its laws; the message names the kind, law, spec and instant."""


def _fail(provider: Any, law: str, detail: str, spec: Any = None, at_ms: int | None = None) -> None:
    where = "" if spec is None else f" for spec {spec!r}" + ("" if at_ms is None else f" at {at_ms}")
    raise LawViolation(f"trigger kind {getattr(provider, 'kind', '?')!r} breaks '{law}'{where}: {detail}")


def check_is_a_provider(provider: Any) -> None:
    """The object is a :class:`~qinglong.contracts.providers.TriggerProvider` with a usable ``kind``
    (the host refuses anything else when it loads the plugin)."""
    if not isinstance(provider, TriggerProvider):
        _fail(provider, "is a TriggerProvider", "kind, validate, next_after, latest_at_or_before and "
              "describe are not all there")
    if not isinstance(provider.kind, str) or not provider.kind:
        _fail(provider, "is a TriggerProvider", f"kind {provider.kind!r} is not a non-empty string")


def check_validate_idempotent(provider: TriggerProvider, raw: Any) -> Mapping[str, Any] | None:
    """Validate ``raw``; return the normalised spec, or None when the provider refused it.

    A refusal must be a :class:`~qinglong.contracts.errors.TriggerSpecError` of this kind naming a
    field. An accepted spec must be a mapping, JSON that round-trips unchanged, and validate to
    itself; ``raw`` must not be changed by validating it.
    """
    before = copy.deepcopy(raw)
    try:
        spec = provider.validate(raw)
    except TriggerSpecError as exc:
        if exc.kind != provider.kind or not exc.field:
            _fail(provider, "refusals name the kind and the field",
                  f"TriggerSpecError(kind={exc.kind!r}, field={exc.field!r})", raw)
        return None
    except Exception as exc:  # anything else is a traceback for the operator
        _fail(provider, "refusals are TriggerSpecError", f"{exc.__class__.__name__}: {exc}", raw)
    if raw != before:
        _fail(provider, "validate does not change its input", f"it became {raw!r}", before)
    if not isinstance(spec, Mapping):
        _fail(provider, "validate returns a mapping", f"got {spec!r}", raw)
    try:
        stored = json.loads(json.dumps(spec, allow_nan=False))
    except (TypeError, ValueError) as exc:
        _fail(provider, "the normalised spec is JSON", str(exc), raw)
    if stored != spec:
        _fail(provider, "the normalised spec survives JSON unchanged", f"{spec!r} came back as {stored!r}", raw)
    again = provider.validate(copy.deepcopy(spec))
    if again != spec:
        _fail(provider, "validate is idempotent", f"{spec!r} validated again to {again!r}", raw)
    return spec


def check_purity(provider: TriggerProvider, spec: Mapping[str, Any], at_ms: int,
                 fresh: Callable[[], TriggerProvider] | None = None) -> None:
    """The same answers for the same spec and instant: twice, from a deep copy of the spec, and
    from ``fresh()`` (a new provider, when given); and the spec is left as it was."""
    before = copy.deepcopy(spec)

    def answers(p: TriggerProvider, s: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        return p.next_after(s, at_ms), p.latest_at_or_before(s, at_ms), p.describe(s)

    first = answers(provider, spec)
    for label, other in (("a second call", answers(provider, spec)),
                         ("a copy of the spec", answers(provider, copy.deepcopy(spec))),
                         *((("a fresh provider", answers(fresh(), copy.deepcopy(spec))),) if fresh else ())):
        if other != first:
            _fail(provider, "the same inputs give the same answers",
                  f"{first!r} then {other!r} from {label}", spec, at_ms)
    if spec != before:
        _fail(provider, "queries do not change the spec", f"it became {spec!r}", before, at_ms)


def _occurrence(provider: TriggerProvider, law: str, value: Any, spec: Any, at_ms: int) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        _fail(provider, law, f"{value!r} is not an integer epoch millisecond or None", spec, at_ms)
    return value


def check_next_after(provider: TriggerProvider, spec: Mapping[str, Any], after_ms: int) -> None:
    """``next_after`` is None or strictly after ``after_ms``, and stepping from it moves forward
    (a cursor that stalls admits nothing again; one that goes back admits twice)."""
    law = "next_after is strictly increasing"
    nxt = _occurrence(provider, law, provider.next_after(spec, after_ms), spec, after_ms)
    if nxt is None:
        return
    if nxt <= after_ms:
        _fail(provider, law, f"next_after gave {nxt}, not after {after_ms}", spec, after_ms)
    following = _occurrence(provider, law, provider.next_after(spec, nxt), spec, nxt)
    if following is not None and following <= nxt:
        _fail(provider, law, f"after {nxt} came {following}", spec, after_ms)


def check_agreement(provider: TriggerProvider, spec: Mapping[str, Any], at_ms: int) -> None:
    """``next_after`` and ``latest_at_or_before`` describe one set of occurrences.

    With ``n = next_after(t)`` and ``p = latest_at_or_before(t)``: ``p <= t < n``;
    ``latest_at_or_before(n) == n``; nothing lies between them (``latest_at_or_before(n - 1) == p``,
    ``next_after(p) == n``); and ``next_after(p - 1) == p``. A ``fire_once`` misfire admits ``p``
    and moves the cursor to ``n``: a disagreement admits one occurrence twice or never.
    """
    law = "next_after and latest_at_or_before agree"
    n = _occurrence(provider, law, provider.next_after(spec, at_ms), spec, at_ms)
    p = _occurrence(provider, law, provider.latest_at_or_before(spec, at_ms), spec, at_ms)
    if p is not None and p > at_ms:
        _fail(provider, law, f"latest_at_or_before gave {p}, after the instant", spec, at_ms)
    if n is not None and n <= at_ms:
        _fail(provider, law, f"next_after gave {n}, not after the instant", spec, at_ms)
    checks: list[tuple[str, Any, Any]] = []
    if n is not None:
        checks.append((f"latest_at_or_before({n})", provider.latest_at_or_before(spec, n), n))
        checks.append((f"latest_at_or_before({n - 1})", provider.latest_at_or_before(spec, n - 1), p))
    if p is not None:
        checks.append((f"next_after({p})", provider.next_after(spec, p), n))
        checks.append((f"next_after({p - 1})", provider.next_after(spec, p - 1), p))
    for call, got, expected in checks:
        if got != expected:
            _fail(provider, law, f"{call} gave {got!r}, expected {expected!r} "
                  f"(next_after={n!r}, latest_at_or_before={p!r})", spec, at_ms)


def check_example_spec(provider: Any, at_ms: int, every_ms: int = 1000) -> Mapping[str, Any] | None:
    """For a provider offering ``example_spec`` (:class:`~qinglong.contracts.providers.OffersExampleSpec`):
    the example validates to itself and fires every ``every_ms`` at multiples of it since the epoch.
    Returns the example, or None when the provider offers none for this period."""
    if not isinstance(provider, OffersExampleSpec):
        return None
    spec = provider.example_spec(every_ms)
    if spec is None:
        return None
    law = "an example spec fires at its period"
    if check_validate_idempotent(provider, copy.deepcopy(spec)) != spec:
        _fail(provider, law, "the example is not a normalised spec (validate changes or refuses it)", spec)
    n, p = provider.next_after(spec, at_ms), provider.latest_at_or_before(spec, at_ms)
    if n is None or p is None or n - p != every_ms or n % every_ms:
        _fail(provider, law, f"occurrences {p!r} and {n!r} around the instant are not {every_ms} ms "
              "apart on multiples of it", spec, at_ms)
    return spec


def check_provider_laws(provider: TriggerProvider, spec: Mapping[str, Any], at_ms: int,
                        fresh: Callable[[], TriggerProvider] | None = None) -> None:
    """Every law for one normalised ``spec`` and instant ``at_ms`` (epoch ms)."""
    check_is_a_provider(provider)
    if check_validate_idempotent(provider, copy.deepcopy(spec)) != spec:
        _fail(provider, "validate is idempotent", "the spec under test is not normalised: pass what "
              "validate returned", spec)
    check_purity(provider, spec, at_ms, fresh)
    check_next_after(provider, spec, at_ms)
    check_agreement(provider, spec, at_ms)
    check_example_spec(provider, at_ms)


#: Instants the default strategy draws from: 1970 to 2100, in epoch ms.
DEFAULT_INSTANTS = (0, 4_102_444_800_000)


def provider_law_test(provider: TriggerProvider, raw_specs: Any, instants: Any = None, *,
                      fresh: Callable[[], TriggerProvider] | None = None,
                      max_examples: int = 200) -> Callable[..., None]:
    """A hypothesis test of every law over generated specs and instants; assign it in a test module::

        from hypothesis import strategies as st
        from qinglong.testing.provider_laws import provider_law_test

        test_interval_keeps_the_provider_laws = provider_law_test(
            IntervalProvider(), st.fixed_dictionaries({"every_ms": st.integers(1_000, 10**9)}),
            fresh=IntervalProvider)

    ``raw_specs`` is a strategy of specs as operators write them: each is validated (a refusal
    must be a ``TriggerSpecError`` naming the field, and is otherwise fine) and the normalised
    spec is checked at a drawn instant (``instants``, default 1970-2100 in epoch ms).
    """
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    times = instants if instants is not None else st.integers(*DEFAULT_INSTANTS)

    @settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(raw=raw_specs, at_ms=times)
    def test_provider_laws(raw: Any, at_ms: int) -> None:
        spec = check_validate_idempotent(provider, raw)
        if spec is not None:
            check_provider_laws(provider, spec, at_ms, fresh)

    test_provider_laws.__doc__ = (f"The {provider.kind!r} provider keeps every trigger-provider law "
                                  "(qinglong.testing.provider_laws).")
    return test_provider_laws


__all__ = [
    "DEFAULT_INSTANTS",
    "LawViolation",
    "check_agreement",
    "check_example_spec",
    "check_is_a_provider",
    "check_next_after",
    "check_provider_laws",
    "check_purity",
    "check_validate_idempotent",
    "provider_law_test",
]
