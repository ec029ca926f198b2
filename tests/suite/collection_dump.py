"""A pytest plugin for the suite's own tests: after collection (and ``-m`` selection), write each
selected item's node id, marks, fixture closure, parameters and hang bound to the JSON file named
by ``QINGLONG_COLLECTION_DUMP``, and the same of each item the selection left out, so that one
collection shows both sides of a selection."""

from __future__ import annotations

import json
import os

import pytest


_DESELECTED: list = []


def _row(item) -> dict:
    timeout = item.get_closest_marker("timeout")
    callspec = getattr(item, "callspec", None)
    return {
        "nodeid": item.nodeid,
        "marks": sorted({m.name for m in item.iter_markers()}),
        "fixtures": sorted(getattr(item, "fixturenames", ())),
        "params": {k: repr(v) for k, v in (callspec.params.items() if callspec else ())},
        "timeout": timeout.args[0] if timeout is not None and timeout.args else None,
    }


def pytest_deselected(items):
    _DESELECTED.extend(items)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    target = os.environ.get("QINGLONG_COLLECTION_DUMP")
    if not target:
        return
    with open(target, "w") as fh:
        json.dump({"timeout_ini": session.config.getini("timeout"),
                   "items": [_row(item) for item in session.items],
                   "deselected": [_row(item) for item in _DESELECTED]}, fh)
