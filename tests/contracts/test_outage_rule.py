"""The one rule of every wait for the store (``errors.outage``): what ``qinglong run`` waits out
at start and ``qinglong db wait`` waits out is the same set of errors."""

from __future__ import annotations

from hypothesis import given, strategies as st

from qinglong.contracts import errors as e

#: every error type of the contracts, with whether a wait may outlast it
_TYPES = {
    e.StoreUnreachable: True,
    e.StoreAuthFailed: False,
    e.StoreUnavailable: False,
    e.StoreReadOnly: False,
    e.StoreFull: False,
    e.StoreLocked: False,
    e.StoreMissing: False,
    e.SchemaNotReady: False,
    e.SettingsError: False,
    e.FenceLost: False,
    e.CheckFailed: False,
    e.QinglongError: False,
}


@given(st.sampled_from(sorted(_TYPES, key=lambda t: t.__name__)), st.text(max_size=40))
def test_only_an_unreachable_store_is_waited_out(error_type, message):
    """A refused login, a locked, read-only or full store taken for an outage would hold a start
    for its whole bound before saying what is wrong; an unreachable store not taken for one
    would end a replica that a database restart should only have delayed."""
    assert e.outage(error_type(message)) is _TYPES[error_type]


@given(st.text(max_size=40))
def test_an_unreachable_store_that_also_refused_the_login_is_not_waited_out(message):
    """A type that is both (a backend's refused login raised as a connection error) ends the
    wait: the login decides."""

    class Both(e.StoreUnreachable, e.StoreAuthFailed):
        pass

    assert not e.outage(Both(message))
    assert e.exit_code_for(Both(message)) is e.ExitCode.UNAVAILABLE
