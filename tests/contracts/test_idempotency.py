"""The idempotency key of an admitted occurrence: ``ql3:cron:v1:<triggerId>:<triggerRevision>:<scheduledForMs>``.

Every store puts a UNIQUE constraint on this key, so it is the last line of defence against a
duplicate Run: two admissions of one occurrence must produce the same key, and two different
occurrences (or revisions) must never share one.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong.contracts.errors import UserError
from qinglong.contracts.idempotency import idempotency_key
from qinglong.contracts.store import check_identifier

IDENTIFIERS = st.text(
    alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."),
    min_size=1,
    max_size=64,
)


def test_cron_key_has_the_exact_decision_record_format():
    """The format is fixed by the decision record; a drift would let old and new keys coexist (duplicates)."""
    assert idempotency_key("nightly-backup", 3, 1_711_846_800_000, "cron") == "ql3:cron:v1:nightly-backup:3:1711846800000"


def test_the_kind_has_no_default():
    """A default kind let a store give an interval occurrence the cron key (``ql3:cron:...``): two
    kinds' keys could collide and block a Run, and the key would lie about its trigger."""
    with pytest.raises(TypeError):
        idempotency_key("t", 1, 0)  # type: ignore[call-arg]
    assert idempotency_key("t", 1, 0, kind="cron") == "ql3:cron:v1:t:1:0"


def test_other_kinds_name_themselves_in_the_key():
    """A plugin's kind takes the cron slot, so an interval occurrence never collides with a cron one."""
    assert idempotency_key("t", 1, 5_000, kind="interval") == "ql3:interval:v1:t:1:5000"


def test_large_millisecond_values_are_written_exactly():
    """Beyond 2**53 a float would round; the key must keep every millisecond digit."""
    assert idempotency_key("t", 1, 2**62 + 1, "cron").endswith(":4611686018427387905")


@settings(max_examples=300, deadline=None)
@given(IDENTIFIERS, st.integers(1, 10**6), st.integers(0, 2**62))
def test_the_same_occurrence_always_gets_the_same_key_and_the_key_parses_back(trigger_id, revision, scheduled):
    """Two admissions of one occurrence must collide on the UNIQUE key; the key must round-trip its parts."""
    key = idempotency_key(trigger_id, revision, scheduled, "cron")
    assert key == idempotency_key(trigger_id, revision, scheduled, "cron")
    prefix, kind, version, parsed_id, parsed_revision, parsed_scheduled = key.split(":")
    assert (prefix, kind, version) == ("ql3", "cron", "v1")
    assert (parsed_id, int(parsed_revision), int(parsed_scheduled)) == (trigger_id, revision, scheduled)


@settings(max_examples=300, deadline=None)
@given(
    st.tuples(IDENTIFIERS, st.integers(1, 1000), st.integers(0, 2**62)),
    st.tuples(IDENTIFIERS, st.integers(1, 1000), st.integers(0, 2**62)),
)
def test_different_occurrences_never_share_a_key(first, second):
    """Distinct (trigger, revision, occurrence) triples get distinct keys, or one Run would block another."""
    if first != second:
        assert idempotency_key(*first, "cron") != idempotency_key(*second, "cron")


def test_a_new_revision_gives_the_same_instant_a_new_key():
    """After a new revision the same wall instant is a new occurrence (the cursor was reset), so a new key."""
    assert idempotency_key("t", 1, 60_000, "cron") != idempotency_key("t", 2, 60_000, "cron")


def test_identifiers_cannot_contain_the_key_separator():
    """Trigger ids are checked before any write; a ':' would make ``a:1`` + rev 2 look like ``a`` + rev 1."""
    with pytest.raises(UserError):
        check_identifier("trigger_id", "a:1")


@pytest.mark.parametrize("scheduled", [1.5, 1_000.0, "1000", None, True, False])
def test_a_non_integer_occurrence_time_is_refused(scheduled):
    """``1000.0`` would write ``1000.0`` and miss the UNIQUE match with ``1000`` (a duplicate Run)."""
    with pytest.raises(TypeError):
        idempotency_key("t", 1, scheduled, "cron")  # type: ignore[arg-type]


@pytest.mark.parametrize("revision", [0, -1])
def test_a_revision_below_one_is_refused(revision):
    """Revisions start at 1; a 0 would be a key no published trigger can own."""
    with pytest.raises(ValueError):
        idempotency_key("t", revision, 1_000, "cron")


@pytest.mark.parametrize("kind", ["cron:v2", ":"])
def test_a_kind_containing_the_separator_is_refused(kind):
    """A ':' in the kind would shift every later part of the key."""
    with pytest.raises(ValueError):
        idempotency_key("t", 1, 1_000, kind=kind)


@pytest.mark.parametrize("revision", [True, 1.5, "1"])
def test_a_non_integer_revision_is_refused(revision):
    """``True`` would write ``...:True:...`` and never match the key of revision 1 (a duplicate Run)."""
    with pytest.raises(TypeError, match="trigger_revision must be an integer"):
        idempotency_key("t", revision, 1_000, "cron")  # type: ignore[arg-type]
