"""The admission message carries every argument as a literal the replica writes itself: a value
that needs escaping must reach the database as it was, never cut the message short or change it."""

from __future__ import annotations

from tests.support.cluster import arun, seed, set_cursor
from tests.support.aio import closing


def test_an_owner_with_quotes_backslashes_and_non_ascii_admits_its_page_unchanged(cluster):
    """If a quote or a backslash in the replica's owner name were written into the message
    unescaped, the page's admission would fail every round (its occurrences delayed until
    another replica took them over) or, worse, record an owner that is not the fence's, so the
    fence check would refuse the page as someone else's claim."""
    owner = "pod's \\x27 ü\\"
    seed(cluster, 4)
    set_cursor(cluster, None, -1000)

    async def body():
        backend = cluster.backend(owner)
        async with closing(backend):
            return await backend.run_round()

    report = arun(body())
    assert report.errors == 0 and report.fence_lost == 0, report
    assert report.admitted == 4, report
    assert cluster.sql("SELECT DISTINCT admitted_by FROM qinglong.runs") == [(owner,)]
    assert cluster.count("attempts") == 4 and cluster.count("run_events") == 8
