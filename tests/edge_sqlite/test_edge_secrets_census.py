"""The start's census of sealed values on a router: every trigger is read, one row at a time, so
what the start holds does not grow with the table (a router keeps what a start allocated for the
life of the process), and the census still seals what is in clear and refuses a missing key."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import tracemalloc

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from qinglong.contracts.errors import SecretsError
from qinglong.contracts.records import TriggerDefinition
from qinglong.contracts.secrets import Sealer, is_sealed, sealed_key_id
from qinglong.plugins.chain import HookProvider

from qinglong.plugins.edge_sqlite import create_backend

from edge_helpers import cron, make_context, seed

COPIES = 5000
HOOK_SECRET = "hook-hmac-" + "5d2b" * 8


def with_copies(path, count: int) -> None:
    """``count`` more cron triggers beside ``c0``, written as the publisher wrote ``c0``."""
    conn = sqlite3.connect(path)
    try:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(triggers)")]
        copied = ", ".join("'c' || i" if c == "trigger_id" else c for c in columns)
        with conn:
            conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                f"INSERT INTO triggers ({', '.join(columns)}) SELECT {copied} "
                "FROM triggers, n WHERE trigger_id = 'c0'", (count,))
    finally:
        conn.close()


async def opened(db_path, clock, sealer=None):
    """The backend as a host with ``sealer`` (None: a store from before values were sealed) and
    the hook trigger kind opens it."""
    context = make_context(db_path, clock)
    context = dataclasses.replace(context, sealer=sealer, providers={**context.providers, "hook": HookProvider()})
    backend = create_backend(context)
    await backend.open()
    await backend.migrate()
    await backend.check_readiness()
    return backend


async def test_the_census_of_a_large_table_holds_one_row_at_a_time(db_path, clock):
    """If the start read every trigger at once, a router with 10,000 triggers would keep 3 MiB
    more resident for the life of the process (its allocator does not hand the pages back), and
    the figure would grow with every trigger added, the more as specs grow."""
    key = os.urandom(32)
    backend = await opened(db_path, clock, Sealer([key], AESGCM))
    try:
        await seed(backend)
        await backend.publisher().put_trigger(cron("c0"))
    finally:
        await backend.close()
    with_copies(db_path, COPIES)
    backend = await opened(db_path, clock, Sealer([key], AESGCM))
    try:
        tracemalloc.start()
        try:
            await backend.check_secrets()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        await backend.close()
    # each row read at once holds its Row and four strings (some 300 bytes): 5,000 rows, 1.5 MB
    assert peak < 256 * 1024, f"the census held {peak} bytes for {COPIES} triggers"


def hook(trigger_id: str) -> TriggerDefinition:
    return TriggerDefinition("p1", trigger_id, "t1", "hook", {"secret": HOOK_SECRET, "window_s": 300})


async def test_the_census_seals_a_secret_in_clear_and_refuses_a_missing_key(db_path, clock):
    """If the streamed census missed a row, a hook secret written in clear before secrets were
    sealed would stay readable in every copy of the file, and a start without the key that seals
    another would begin and refuse that hook's deliveries only when they came."""
    backend = await opened(db_path, clock)  # written before secrets were sealed
    try:
        await seed(backend)
        await backend.publisher().put_trigger(cron("c0"))
        await backend.publisher().put_trigger(hook("zz-last"))
    finally:
        await backend.close()
    with_copies(db_path, 300)
    assert HOOK_SECRET.encode() in db_path.read_bytes() + _wal(db_path)
    first, other = Sealer([os.urandom(32)], AESGCM), Sealer([os.urandom(32)], AESGCM)
    backend = await opened(db_path, clock, first)
    try:
        await backend.check_secrets()
    finally:
        await backend.close()
    stored = sqlite3.connect(db_path).execute(
        "SELECT json_extract(spec_json, '$.secret') FROM triggers WHERE trigger_id = 'zz-last'").fetchone()[0]
    assert is_sealed(stored) and sealed_key_id(stored) == first.key_id
    assert HOOK_SECRET.encode() not in db_path.read_bytes() + _wal(db_path)
    backend = await opened(db_path, clock, other)
    try:
        with pytest.raises(SecretsError, match="key_file"):
            await backend.check_secrets()
    finally:
        await backend.close()


def _wal(path) -> bytes:
    wal = f"{path}-wal"
    return open(wal, "rb").read() if os.path.exists(wal) else b""
