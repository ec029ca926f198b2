"""Properties of the checks every publisher runs before it writes anything.

``check_misfire_grace`` and ``skip_grace_floor_ms`` refuse a ``skip`` trigger whose grace cannot
be met (it would skip on-time occurrences and never fire); ``validate_definition`` bounds the grace
(a huge one overflowed the stores' 64-bit arithmetic with a traceback); ``check_identifier`` keeps
ids that a shell or a path would misread (``-x``, ``.``, ``..``) or that would break the
idempotency key (``:``) out of every store. Each is pure and raises a user error naming what is
wrong, so both backends refuse alike.
"""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong.contracts.errors import ExitCode, TriggerSpecError, UserError, exit_code_for
from qinglong.contracts.records import MAX_MISFIRE_GRACE_MS, MisfirePolicy, TriggerDefinition
from qinglong.contracts.store import (
    SchedulerLimits,
    check_identifier,
    check_misfire_grace,
    skip_grace_floor_ms,
    validate_definition,
)
from qinglong.plugins.cron.provider import CronProvider

PROPERTIES = settings(max_examples=300, deadline=None)

PROVIDERS = {"cron": CronProvider()}

#: What ``check_identifier`` documents, written out independently: 1-64 ASCII letters, digits,
#: '-', '_' and '.', the first a letter or digit.
IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)


def definition(policy: MisfirePolicy | str = MisfirePolicy.SKIP, grace=60_000, trigger_id: str = "nightly",
               project_id: str = "p1", task_id: str = "t1") -> TriggerDefinition:
    """An every-minute cron trigger definition."""
    return TriggerDefinition(project_id, trigger_id, task_id, "cron",
                             {"expression": "* * * * *", "timezone": "UTC"}, MisfirePolicy(policy), grace, True)


def limits(cadence_ms: int, lease_ms: int) -> SchedulerLimits:
    """Scheduler limits with the given cadence and lease."""
    return SchedulerLimits(page_size=64, claim_budget=16, lease_ms=lease_ms, cadence_ms=cadence_ms)


# --- the skip-grace floor -----------------------------------------------------------------------


@PROPERTIES
@given(st.integers(1, 3_600_000), st.integers(1, 3_600_000), st.booleans(), st.sampled_from(list(MisfirePolicy)),
       st.data())
def test_skip_is_refused_exactly_when_its_grace_is_at_or_below_the_floor(cadence, lease, leased, policy, data):
    """Refused iff policy is ``skip`` and grace <= cadence (+ lease when leased); everything else passes.

    A ``skip`` trigger accepted with a grace at or below the floor would record its on-time
    occurrences as skipped and never fire (silently lost Runs); one refused above the floor, or a
    ``fire_once`` trigger refused at all, would turn away a definition that works.
    """
    floor = cadence + (lease if leased else 0)
    grace = data.draw(st.one_of(
        st.sampled_from([0, 1, floor - 1, floor, floor + 1, MAX_MISFIRE_GRACE_MS]),
        st.integers(0, 3 * floor),
    ).filter(lambda g: 0 <= g <= MAX_MISFIRE_GRACE_MS))
    the_limits = limits(cadence, lease)
    assert skip_grace_floor_ms(the_limits, leased=leased) == floor
    candidate = definition(policy, grace)
    if policy is MisfirePolicy.SKIP and grace <= floor:
        with pytest.raises(TriggerSpecError) as refused:
            check_misfire_grace(candidate, the_limits, leased=leased)
        message = str(refused.value)
        assert "'nightly'" in message and f"{grace} ms" in message and f"above {floor} ms" in message
        assert refused.value.field == "misfire_grace_ms"
        assert exit_code_for(refused.value) == ExitCode.USER_ERROR
    else:
        assert check_misfire_grace(candidate, the_limits, leased=leased) is None


def test_the_cluster_floor_names_the_lease_and_the_edge_floor_does_not():
    """The refusal says what the grace must exceed, so a user can fix it without reading the code."""
    the_limits = limits(1_000, 30_000)
    with pytest.raises(TriggerSpecError, match=r"cadence \(1000 ms\) plus the claim lease \(30000 ms\)"):
        check_misfire_grace(definition(grace=31_000), the_limits, leased=True)
    with pytest.raises(TriggerSpecError) as edge:
        check_misfire_grace(definition(grace=1_000), the_limits, leased=False)
    assert "lease" not in str(edge.value) and "cadence (1000 ms)" in str(edge.value)
    check_misfire_grace(definition(grace=1_001), the_limits, leased=False)
    check_misfire_grace(definition(grace=31_001), the_limits, leased=True)


# --- the grace bounds ---------------------------------------------------------------------------


@PROPERTIES
@given(st.integers(0, MAX_MISFIRE_GRACE_MS))
def test_every_grace_within_the_bounds_is_accepted(grace):
    """A grace from 0 to MAX_MISFIRE_GRACE_MS inclusive is a valid definition (refusing one would
    turn away a trigger every store can honour)."""
    spec, kind = validate_definition(definition(MisfirePolicy.FIRE_ONCE, grace), PROVIDERS)
    assert kind == "cron" and spec["expression"] == "* * * * *"


@PROPERTIES
@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_MISFIRE_GRACE_MS + 1),
                 st.sampled_from([-1, MAX_MISFIRE_GRACE_MS + 1, 2**63, 2**64, 2**70, -(2**70), 10**100])))
def test_a_grace_outside_the_bounds_is_refused_as_a_spec_error(grace):
    """A negative or too large grace (2**70 once ended in an OverflowError traceback in the store)
    is refused by name before anything is written."""
    with pytest.raises(TriggerSpecError) as refused:
        validate_definition(definition(MisfirePolicy.FIRE_ONCE, grace), PROVIDERS)
    assert refused.value.field == "misfire_grace_ms"
    assert str(MAX_MISFIRE_GRACE_MS) in str(refused.value)


@pytest.mark.parametrize("grace", [True, False, 1.0, 60_000.0, "60000", None, float("nan")])
def test_a_grace_that_is_not_an_integer_is_refused(grace):
    """``True`` would be stored as 1 ms, ``60000.0`` may be rounded or rejected by a store later:
    both are refused up front as a spec error, not a TypeError traceback."""
    with pytest.raises(TriggerSpecError, match="misfire_grace_ms"):
        validate_definition(definition(MisfirePolicy.FIRE_ONCE, grace), PROVIDERS)


def test_the_grace_ceiling_is_366_days():
    """The documented ceiling; a change would accept graces a store cannot add to a cursor."""
    assert MAX_MISFIRE_GRACE_MS == 366 * 24 * 3600 * 1000
    validate_definition(definition(MisfirePolicy.SKIP, MAX_MISFIRE_GRACE_MS), PROVIDERS)


# --- identifiers --------------------------------------------------------------------------------

#: Letters and digits of several scripts, every ASCII punctuation mark, whitespace and controls.
ALPHABET = st.sampled_from(
    string.ascii_letters + string.digits + string.punctuation + " \t\n\x00\x7f" + "éßΩж中٣²Ⅻ\u200b\ufeff"
)


@PROPERTIES
@given(st.one_of(st.text(ALPHABET, max_size=70), st.text(max_size=70),
                 st.text(st.sampled_from(string.ascii_letters + string.digits + "-_."), min_size=60, max_size=70)))
def test_an_identifier_is_accepted_exactly_when_it_matches_the_documented_form(value):
    """Accepted iff 1-64 ASCII letters, digits, '-', '_' or '.', starting with a letter or digit.

    An id like ``-x`` is read as an option, ``.``/``..`` as a path, a ':' shifts the parts of the
    idempotency key (two occurrences could share one), non-ASCII letters look alike on a terminal;
    accepting any of them lets one trigger masquerade as another.
    """
    if IDENTIFIER.fullmatch(value):
        assert check_identifier("trigger_id", value) is None
    else:
        with pytest.raises(UserError) as refused:
            check_identifier("trigger_id", value)
        assert "trigger_id" in str(refused.value)
        assert exit_code_for(refused.value) == ExitCode.USER_ERROR


@pytest.mark.parametrize("value", ["-x", "--help", ".", "..", "", "a" * 65, "é", "ab\u00e9", "a:b", ":", "a b",
                                   "a/b", "_x", ".hidden", "a\n", "\uff41", "٣"])
def test_identifiers_a_shell_a_path_or_the_key_would_misread_are_refused(value):
    """Each of these was, or could be, taken for an option, a path, or another id."""
    with pytest.raises(UserError, match="invalid project_id"):
        check_identifier("project_id", value)


@pytest.mark.parametrize("value", ["a", "0", "a" * 64, "nightly-backup", "v1.2_rc-3", "Z9", "9-.", "a..b"])
def test_identifiers_of_the_documented_form_are_accepted(value):
    """What the docs promise must keep working (a refusal would break existing definitions)."""
    check_identifier("project_id", value)


@pytest.mark.parametrize("value", [None, 5, b"abc", ["a"]])
def test_an_identifier_that_is_not_a_string_is_refused_as_a_user_error(value):
    """A settings file or JSON can carry any type; it is refused by name, not with a traceback."""
    with pytest.raises(UserError, match="invalid task_id"):
        check_identifier("task_id", value)


@pytest.mark.parametrize("field", ["project_id", "trigger_id", "task_id"])
def test_validate_definition_checks_every_identifier(field):
    """Each of the three ids of a definition is checked before a store writes it."""
    ids = {"project_id": "p1", "trigger_id": "nightly", "task_id": "t1", field: "-x"}
    with pytest.raises(UserError, match=f"invalid {field}"):
        validate_definition(definition(MisfirePolicy.FIRE_ONCE, **ids), PROVIDERS)
