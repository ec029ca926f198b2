"""The one migration-status algorithm: properties that hold for any shipped stream and ledger."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given, strategies as st

from qinglong.contracts.migrations import migration_states, verdict


@dataclass(frozen=True)
class Row:
    version: int
    name: str
    checksum: str


names = st.sampled_from(["schema", "grants", "skips", "index", "columns"])
checksums = st.sampled_from(["sha256:aa", "sha256:bb", "sha256:cc"])


@st.composite
def shipped_streams(draw, min_size=0):
    size = draw(st.integers(min_size, 8))
    return [Row(v, draw(names), draw(checksums)) for v in range(1, size + 1)]


@st.composite
def stream_and_ledger(draw):
    """A shipped stream and a ledger made of any subset of it, some rows altered, some extra."""
    shipped = draw(shipped_streams())
    ledger = []
    for migration in shipped:
        choice = draw(st.sampled_from(["same", "same", "absent", "renamed", "rechecked"]))
        if choice == "same":
            ledger.append(migration)
        elif choice == "renamed":
            ledger.append(replace(migration, name=migration.name + "_x"))
        elif choice == "rechecked":
            ledger.append(replace(migration, checksum=migration.checksum + "0"))
    extra = draw(st.lists(st.integers(len(shipped) + 1, 20), unique=True, max_size=3))
    ledger += [Row(v, "future", "sha256:ff") for v in extra]
    return shipped, draw(st.permutations(ledger))


@given(stream_and_ledger())
def test_every_migration_is_listed_once_shipped_first_then_unknown(case):
    """A migration listed twice or not at all would be applied twice or never reported."""
    shipped, ledger = case
    states = migration_states(shipped, ledger)
    versions = [s.version for s in states]
    assert versions[:len(shipped)] == [m.version for m in shipped]
    assert versions[len(shipped):] == sorted({r.version for r in ledger} - set(versions[:len(shipped)]))
    assert len(versions) == len(set(versions))


@given(stream_and_ledger())
def test_status_follows_from_the_ledger_row_alone(case):
    """A drifted migration reported as applied would let a process start on a schema it does not
    know; an applied one reported as drifted would refuse a sound database."""
    shipped, ledger = case
    recorded = {r.version: r for r in ledger}
    by_version = {m.version: m for m in shipped}
    for state in migration_states(shipped, ledger):
        row, migration = recorded.get(state.version), by_version.get(state.version)
        if migration is None:
            assert state.status == "unknown" and (state.name, state.checksum) == (row.name, row.checksum)
        elif row is None:
            assert state.status == "pending"
        elif (row.name, row.checksum) == (migration.name, migration.checksum):
            assert state.status == "applied"
        else:
            assert state.status == "drifted" and state.checksum == migration.checksum


@given(stream_and_ledger())
def test_ledger_order_does_not_change_the_states(case):
    """The ledger is a set of rows; a backend reading it in another order must reach the same verdict."""
    shipped, ledger = case
    assert migration_states(shipped, ledger) == migration_states(shipped, sorted(ledger, key=lambda r: r.version))


@given(shipped_streams(), st.data())
def test_a_prefix_of_the_stream_is_safe_and_pending_is_the_rest(shipped, data):
    """An older database (its ledger a prefix of the stream) must be migrated forward, exactly by
    the migrations it lacks; refusing it would strand every upgrade."""
    applied = data.draw(st.integers(0, len(shipped)))
    found = verdict(migration_states(shipped, shipped[:applied]))
    assert found.safe_to_migrate
    assert [s.version for s in found.pending] == [m.version for m in shipped[applied:]]
    assert found.ready == (applied == len(shipped))


@given(shipped_streams(min_size=2), st.data())
def test_a_gap_before_an_applied_migration_is_missing_and_unsafe(shipped, data):
    """Applying a removed middle migration on top of later ones would run it out of order."""
    hole = data.draw(st.integers(1, len(shipped) - 1))
    ledger = [m for m in shipped if m.version != hole]
    found = verdict(migration_states(shipped, ledger))
    assert [s.version for s in found.missing] == [hole]
    assert not found.safe_to_migrate and not found.ready
    assert found.unsafe() == [("missing", found.missing[0])]


@given(stream_and_ledger())
def test_verdict_puts_every_unapplied_state_in_exactly_one_group(case):
    """A state in no group would be silently ignored; in two, reported twice with two meanings."""
    shipped, ledger = case
    states = migration_states(shipped, ledger)
    found = verdict(states)
    groups = [found.altered, found.extra, found.missing, found.pending]
    grouped = [s for group in groups for s in group]
    assert sorted(grouped, key=lambda s: s.version) == [s for s in states if s.status != "applied"]
    assert found.ready == (not grouped)
    assert found.safe_to_migrate == (not (found.altered or found.extra or found.missing))
    assert all(s.status == "drifted" for s in found.altered)
    assert all(s.status == "unknown" for s in found.extra)
    newest = max((s.version for s in states if s.status in ("applied", "drifted")), default=0)
    assert all(s.version < newest for s in found.missing)
    assert all(s.version > newest for s in found.pending)
    unsafe = found.unsafe()
    kinds = [k for k, _ in unsafe]
    assert kinds == sorted(kinds, key=lambda k: k == "missing")
