"""Task env values and trigger secrets at rest, on every backend (SQLite, PostgreSQL 18 and 15):
stored sealed under the host's key, never readable from a dump of the store, digested in clear (so
a republish is no new revision), opened only for a job or a signature, re-sealed by a rotation in
one idempotent transaction, and a start with a key that does not open them is refused."""

from __future__ import annotations

import dataclasses
import os
import subprocess

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from qinglong.contracts.apply import STORED, ChangeAction, DesiredProject
from qinglong.contracts.errors import SecretsError, UserError
from qinglong.contracts.records import TriggerDefinition, content_digest
from qinglong.contracts.secrets import Sealer, env_aad, is_sealed, sealed_key_id, trigger_aad
from qinglong.plugins.chain import HookProvider
from qinglong.testing.conformance.harness import providers
from qinglong.testing.conformance.store import every_second

from tests.conformance.harnesses import SqliteHarness

SECRET = "hunter2-correct-horse-7f3a9c"
PAYLOAD = {"command": ["sh", "-c", "echo $TOKEN"], "env": {"TOKEN": SECRET, "MODE": "plain-but-sealed-too"}}


HOOK_SECRET = "hook-hmac-" + "9c1e" * 8


def hook(trigger_id: str = "gh", secret: str = HOOK_SECRET, window_s: int = 300) -> TriggerDefinition:
    return TriggerDefinition("p1", trigger_id, "t1", "hook", {"secret": secret, "window_s": window_s})


async def trigger_head(h, trigger_id: str):
    """A trigger's head as stored (what the hook route reads)."""
    return (await h.publisher.project_state("p1")).triggers[trigger_id]


def key_pair() -> tuple[bytes, bytes]:
    return os.urandom(32), os.urandom(32)


def sealer(*keys: bytes) -> Sealer:
    return Sealer(list(keys), AESGCM)


def dump(h) -> bytes:
    """Everything the store holds, as an operator's dump shows it: the SQLite file (and its WAL)
    byte for byte; ``pg_dump`` of the PostgreSQL database."""
    if isinstance(h, SqliteHarness):
        data = b""
        for suffix in ("", "-wal", "-journal"):
            path = str(h.path) + suffix
            if os.path.exists(path):
                with open(path, "rb") as handle:
                    data += handle.read()
        return data
    proc = subprocess.run([str(h.server.bin_dir / "pg_dump"), "--dbname", h.server.superuser_dsn(h.dbname)],
                          capture_output=True, timeout=120, check=True)
    assert b"task_revisions" in proc.stdout
    return proc.stdout


async def head(h, project_id: str, task_id: str):
    """A task's head record as stored (every publisher reads it back for ``apply``)."""
    return (await h.publisher.project_state(project_id)).tasks[task_id]


async def with_sealer(h, s, found: dict | None = None) -> None:
    """The harness's backend again, now given ``s`` (a process restarted with other keys)."""
    h.sealer = s
    await h.restart(found)


async def with_hooks(h, s) -> None:
    """As :func:`with_sealer`, the ``hook`` trigger kind loaded too."""
    await with_sealer(h, s, {**providers(), "hook": HookProvider()})


async def test_env_values_are_stored_sealed_and_no_dump_shows_them(harness):
    h = harness
    await with_sealer(h, sealer(os.urandom(32)))
    await h.publisher.create_project("p1")
    record = await h.publisher.put_task("p1", "t1", PAYLOAD)
    assert record.content_digest == content_digest(PAYLOAD)  # the digest is of the values in clear
    stored = await head(h, "p1", "t1")
    assert all(is_sealed(v) for v in stored.payload["env"].values())
    await h.publisher.put_trigger(every_second("tr1"))
    await h.run_round()
    await h.elapse(3000)
    report = await h.run_round()
    assert report.admitted >= 1  # a sealed payload is admitted like any other
    run = (await h.reader.recent_runs(limit=1, trigger_id="tr1"))[0]
    context = await h.backend.outbox().run_context(run.run_id, 1000)
    assert set(context.env_values) == set(PAYLOAD["env"].values())  # what a log tail is redacted of
    data = dump(h)
    assert SECRET.encode() not in data and b"plain-but-sealed-too" not in data
    assert b"ql-sealed:v1:" in data


async def test_a_republished_payload_is_no_new_revision_and_kept_values_stay(harness):
    h = harness
    await with_sealer(h, sealer(os.urandom(32)))
    await h.publisher.create_project("p1")
    first = await h.publisher.put_task("p1", "t1", PAYLOAD)
    again = await h.publisher.put_task("p1", "t1", PAYLOAD)
    assert again.task_revision == first.task_revision
    stored = await head(h, "p1", "t1")
    kept = await h.publisher.put_task("p1", "t1", {**PAYLOAD, "env": dict(stored.payload["env"])})
    assert kept.task_revision == first.task_revision  # the head's sealed values are the same values
    await h.publisher.put_task("p1", "t2", PAYLOAD)
    other = await head(h, "p1", "t2")
    with pytest.raises(UserError) as refused:  # bound to t2: it does not open as t1's
        await h.publisher.put_task("p1", "t1", {**PAYLOAD, "env": {"TOKEN": other.payload["env"]["TOKEN"]}})
    assert SECRET not in str(refused.value)
    assert (await head(h, "p1", "t1")).task_revision == first.task_revision


async def test_an_applied_project_keeping_stored_values_is_unchanged(harness):
    h = harness
    await with_sealer(h, sealer(os.urandom(32)))
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", PAYLOAD)
    desired = DesiredProject("p1", tasks={"t1": {**PAYLOAD, "env": {"TOKEN": STORED, "MODE": STORED}}})
    plan = await h.publisher.apply_project(desired)
    assert [c.action for c in plan.changes if c.object_id == "t1"] == [ChangeAction.UNCHANGED]
    changed = DesiredProject("p1", tasks={"t1": {**PAYLOAD, "env": {"TOKEN": STORED, "MODE": "new"}}})
    plan = await h.publisher.apply_project(changed)
    assert [c.action for c in plan.changes if c.object_id == "t1"] == [ChangeAction.UPDATE]
    assert SECRET.encode() not in dump(h) and b'"new"' not in dump(h)


async def test_a_rotation_reseals_every_value_once_and_a_second_run_finds_nothing(harness):
    h = harness
    old, new = key_pair()
    await with_sealer(h, sealer(old))
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", PAYLOAD)
    await h.publisher.put_task("p1", "t1", {**PAYLOAD, "env": {"TOKEN": SECRET + "-2"}})
    rotating = sealer(new, old)
    assert await h.backend.reseal_secrets(rotating) > 0
    assert await h.backend.reseal_secrets(rotating) == 0  # idempotent: an interrupted run is finished
    await with_sealer(h, sealer(new))
    await h.backend.check_secrets()  # the new key alone opens everything now
    stored = await head(h, "p1", "t1")
    assert {sealed_key_id(v) for v in stored.payload["env"].values()} == {sealer(new).key_id}
    assert sealer(new).open(stored.payload["env"]["TOKEN"], env_aad("p1", "t1", "TOKEN")) == SECRET + "-2"
    await with_sealer(h, sealer(old))
    with pytest.raises(SecretsError, match=r"\[secrets\] key_file"):
        await h.backend.check_secrets()
    assert SECRET.encode() not in dump(h)


async def test_a_rotation_without_the_old_key_changes_nothing(harness):
    h = harness
    old, new = key_pair()
    await with_sealer(h, sealer(old))
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", PAYLOAD)
    before = (await head(h, "p1", "t1")).payload
    with pytest.raises(SecretsError, match="not loaded"):
        await h.backend.reseal_secrets(sealer(new))
    assert (await head(h, "p1", "t1")).payload == before


async def test_values_in_clear_of_an_older_store_are_sealed_by_a_rotation(harness):
    h = harness
    await with_sealer(h, None)  # a store written before values were sealed
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", PAYLOAD)
    assert SECRET.encode() in dump(h)
    key = os.urandom(32)
    assert await h.backend.reseal_secrets(sealer(key)) > 0
    await with_sealer(h, sealer(key))
    await h.backend.check_secrets()
    assert SECRET.encode() not in dump(h)
    assert (await h.publisher.put_task("p1", "t1", PAYLOAD)).task_revision == 1


async def test_a_hook_secret_is_stored_sealed_and_no_dump_shows_it(harness):
    """If a hook trigger's secret were stored in clear, whoever reads a copy or dump of the store
    could sign deliveries and start its task at will."""
    h = harness
    key = os.urandom(32)
    await with_hooks(h, sealer(key))
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", {"command": ["true"]})
    first = await h.publisher.put_trigger(hook())
    stored = await trigger_head(h, "gh")
    assert is_sealed(stored.spec["secret"]) and stored.spec["window_s"] == 300
    assert sealer(key).open(stored.spec["secret"], trigger_aad("p1", "gh", "secret")) == HOOK_SECRET
    with pytest.raises(Exception):  # bound to its trigger: it does not open as another's
        sealer(key).open(stored.spec["secret"], trigger_aad("p1", "gh2", "secret"))
    # digested in clear: the same secret again, or the head's sealed one kept, is no new revision
    assert (await h.publisher.put_trigger(hook())).trigger_revision == first.trigger_revision
    kept = await h.publisher.put_trigger(hook(secret=stored.spec["secret"]))
    assert kept.trigger_revision == first.trigger_revision
    edited = await h.publisher.put_trigger(hook(secret=stored.spec["secret"], window_s=60))
    assert edited.trigger_revision == first.trigger_revision + 1
    again = await trigger_head(h, "gh")
    assert sealer(key).open(again.spec["secret"], trigger_aad("p1", "gh", "secret")) == HOOK_SECRET
    await h.publisher.set_trigger_enabled("p1", "gh", False)
    await h.publisher.put_trigger(hook("gh2"))
    other = (await trigger_head(h, "gh2")).spec["secret"]
    with pytest.raises(UserError) as refused:  # another trigger's sealed secret is not this one's
        await h.publisher.put_trigger(hook(secret=other))
    assert HOOK_SECRET not in str(refused.value)
    plan = await h.publisher.apply_project(DesiredProject(
        "p1", tasks={"t1": {"command": ["true"]}},
        triggers={"gh": dataclasses.replace(hook(window_s=60), enabled=False), "gh2": hook("gh2")}))
    assert {c.object_id: c.action for c in plan.changes if c.kind.value == "trigger"} == {
        "gh": ChangeAction.UNCHANGED, "gh2": ChangeAction.UNCHANGED}
    assert HOOK_SECRET.encode() not in dump(h)


async def test_a_rotation_reseals_hook_secrets_and_the_old_key_alone_is_refused(harness):
    """If a rotation left a hook secret under the old key, retiring that key would make the hook
    refuse every delivery; if the start check skipped trigger secrets, a missing key would only
    show at the first delivery."""
    h = harness
    old, new = key_pair()
    await with_hooks(h, sealer(old))
    await h.publisher.create_project("p1")
    await h.publisher.put_task("p1", "t1", {"command": ["true"]})
    await h.publisher.put_trigger(hook())
    rotating = sealer(new, old)
    assert await h.backend.reseal_secrets(rotating) == 1
    assert await h.backend.reseal_secrets(rotating) == 0
    await with_hooks(h, sealer(new))
    await h.backend.check_secrets()
    stored = (await trigger_head(h, "gh")).spec["secret"]
    assert sealed_key_id(stored) == sealer(new).key_id
    assert sealer(new).open(stored, trigger_aad("p1", "gh", "secret")) == HOOK_SECRET
    await with_hooks(h, sealer(old))
    with pytest.raises(SecretsError, match=r"\[secrets\] key_file"):
        await h.backend.check_secrets()
    assert HOOK_SECRET.encode() not in dump(h)


async def test_a_hook_secret_in_clear_of_an_older_store_is_sealed_by_a_rotation(harness):
    """If a secret written in clear before secrets were sealed stayed so, a dump would keep
    showing it after the upgrade."""
    h = harness
    await with_hooks(h, None)  # a store written before trigger secrets were sealed
    await h.publisher.create_project("p1")
    first = await h.publisher.put_task("p1", "t1", {"command": ["true"]})
    head_before = await h.publisher.put_trigger(hook())
    assert HOOK_SECRET.encode() in dump(h)
    key = os.urandom(32)
    assert await h.backend.reseal_secrets(sealer(key)) == 1
    await with_hooks(h, sealer(key))
    await h.backend.check_secrets()
    assert HOOK_SECRET.encode() not in dump(h)
    assert (await h.publisher.put_trigger(hook())).trigger_revision == head_before.trigger_revision
    assert first.task_revision == 1
