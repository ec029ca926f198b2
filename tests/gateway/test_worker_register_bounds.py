"""``qinglong worker register`` refuses a registration over its bounds, on real PostgreSQL (both
builds) through the real CLI, naming the field, the limit and the value or count given, and
registers nothing."""

from __future__ import annotations

import pytest

from tests.gateway.helpers import cli, plane_settings
from tests.gateway.test_gateway_attacks import dump

LONG = "w" * 5000


@pytest.mark.parametrize("args, expected", [
    (("worker", "register", LONG), "worker id: expected 1-200 characters"),
    (("worker", "register", "w1", "--label", "l" * 300), "labels: expected at most 32"),
    (("worker", "register", "w1", *[a for n in range(300) for a in ("--project", f"p{n}")]),
     "projects: expected at most 256 projects, got 300"),
], ids=["worker-id", "label", "projects"])
def test_an_overlong_registration_is_refused_and_registers_nothing(cluster, tmp_path, args, expected):
    """A worker registration bound to 300 projects was stored (a row every gateway call reads),
    and a refused id or label was not quoted, so the operator could not see which value was
    wrong. Each is refused with exit code 3, in one line naming the limit and the value (cut to
    80 characters with its length) or the count given; no registration is written."""
    settings = plane_settings(cluster, tmp_path)
    before = dump(cluster)
    done = cli(settings, *args, check=False)
    assert done.returncode == 3, (done.returncode, done.stderr[-600:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qinglong: "), done.stderr
    assert expected in lines[0] and len(lines[0]) < 500, lines[0]
    if args[2] == LONG:
        assert "(5000 characters)" in lines[0], lines[0]
    if "--label" in args:
        assert "(300 characters)" in lines[0], lines[0]
    assert dump(cluster) == before
