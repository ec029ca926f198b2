"""``qinglong apply`` and ``qinglong export`` through the real CLI on an edge store (a real SQLite
file): plans, refusals naming file, line and key, dry runs, pruning, secrets."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.config.config_helpers import store_rows

SECRET = "Zk4-apply-s3cret-value"

GOOD = textwrap.dedent("""\
    version = 1

    [projects.ops]
    name = "Operations"

    [projects.ops.tasks.backup]
    command = ["/bin/sh", "-c", "echo backup"]
    timeout = "30m"
    description = "nightly backup"
    env = { TOKEN = "env:BACKUP_TOKEN" }

    [projects.ops.tasks.report]
    command = ["/bin/true"]
    retry = { max_attempts = 3 }

    [projects.ops.triggers.ops-nightly]
    task = "backup"
    kind = "cron"
    spec = { expression = "30 2 * * *", timezone = "Europe/Berlin" }

    [projects.ops.triggers.ops-hourly]
    task = "report"
    kind = "cron"
    spec = { expression = "0 * * * *" }
    misfire_grace = "5m"
    """)


def _ok(result) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _write(cli, name: str, text: str):
    path = cli.cwd / name
    path.write_text(text)
    return path


def test_apply_creates_then_a_second_apply_changes_nothing(cli):
    """The same file applied twice must make no new revision (each would reset the schedules);
    the plan names what it does and never prints an env value."""
    _write(cli, "jobs.toml", GOOD)
    env = {"BACKUP_TOKEN": SECRET}
    first = _ok(cli("apply", "jobs.toml", extra_env=env))
    assert "+ task ops/backup" in first and "+ trigger ops/ops-nightly" in first
    assert first.splitlines()[-1] == "applied: 5 created, 0 updated, 0 unchanged, 0 deleted"
    before = store_rows(cli.cwd / "qinglong.db")
    second = _ok(cli("apply", "jobs.toml", extra_env=env))
    assert "nothing to change" in second and "= task ops/backup" in second
    assert store_rows(cli.cwd / "qinglong.db") == before
    shown = json.loads(_ok(cli("task", "show", "ops", "backup", "--json")))
    assert shown["execution"]["timeout_ms"] == 1_800_000 and shown["execution"]["env"] == {"TOKEN": "(set)"}
    changed = _ok(cli("apply", "jobs.toml", extra_env={"BACKUP_TOKEN": SECRET + "-2"}))
    assert "~ task ops/backup (env.TOKEN)" in changed
    for text in (first, second, changed):
        assert SECRET not in text


@pytest.mark.parametrize("edit, line, key, words", [
    (lambda t: t.replace('timeout = "30m"', 'timeout = "soon"'), 8,
     "projects.ops.tasks.backup.timeout", "expected a duration"),
    (lambda t: t.replace('retry = { max_attempts = 3 }', 'retry = { max_attempts = 300 }'), 14,
     "projects.ops.tasks.report.retry.max_attempts", "expected an integer from 1 to"),
    (lambda t: t.replace('"30 2 * * *"', '"61 2 * * *"'), 19,
     "projects.ops.triggers.ops-nightly.spec", "the minute field '61' holds 61"),
    (lambda t: t.replace('task = "report"', 'task = "missing"'), 22,
     "projects.ops.triggers.ops-hourly.task", "task 'missing' is not declared"),
    (lambda t: t.replace('description = "nightly backup"', 'descripton = "nightly backup"'), 9,
     "projects.ops.tasks.backup.descripton", "unknown key"),
    (lambda t: t.replace('env = { TOKEN = "env:BACKUP_TOKEN" }', 'env = { TOKEN = "plain-text" }'), 10,
     "projects.ops.tasks.backup.env.TOKEN", "expected env:NAME"),
    (lambda t: t.replace('env = { TOKEN = "env:BACKUP_TOKEN" }', 'env = { TOKEN = { value = "x" } }'), 10,
     "projects.ops.tasks.backup.env.TOKEN", "needs --allow-inline-env"),
    (lambda t: t.replace('"env:BACKUP_TOKEN"', '"env:NOT_SET_ANYWHERE"'), 10,
     "projects.ops.tasks.backup.env.TOKEN", "NOT_SET_ANYWHERE is not set"),
    (lambda t: t.replace('misfire_grace = "5m"', 'misfire_policy = "skip"\nmisfire_grace_ms = 10'), 26,
     "projects.ops.triggers.ops-hourly.misfire_grace_ms", "would be skipped"),
    (lambda t: t.replace('misfire_grace = "5m"', 'jitter = "2d"'), 25,
     "projects.ops.triggers.ops-hourly.jitter", "must be between 0 and 86400000"),
    (lambda t: t.replace('misfire_grace = "5m"', 'jitter = "later"'), 25,
     "projects.ops.triggers.ops-hourly.jitter", "expected a duration"),
    (lambda t: t.replace("version = 1", "version = 2"), 1, "version", "reads version 1"),
    (lambda t: t + "\n[projects.other.triggers.ops-hourly]\ntask = \"x\"\n", 27,
     "projects.other.triggers.ops-hourly", "unique across projects"),
    # tomllib's int() refuses past 4,300 digits with a ValueError: a traceback, not a line
    (lambda t: t.replace("retry = { max_attempts = 3 }", "retry = { max_attempts = " + "3" * 5000 + " }"), 14,
     "(syntax)", "a number of more than 4300 digits"),
])
def test_a_refusal_names_file_line_and_key_and_writes_nothing(cli, edit, line, key, words):
    """A mistake must point at its line (a file of hundreds of jobs is unusable otherwise) and
    must leave the store exactly as it was, exit 3, and never echo a value."""
    _write(cli, "jobs.toml", GOOD)
    _ok(cli("apply", "jobs.toml", extra_env={"BACKUP_TOKEN": SECRET}))
    before = store_rows(cli.cwd / "qinglong.db")
    _write(cli, "bad.toml", edit(GOOD))
    result = cli("apply", "bad.toml", extra_env={"BACKUP_TOKEN": SECRET})
    assert result.returncode == 3, result.stdout + result.stderr
    assert f"bad.toml:{line}: {key}: " in result.stderr, result.stderr
    assert words in result.stderr, result.stderr
    assert SECRET not in result.stderr + result.stdout and "plain-text" not in result.stderr
    assert "Traceback" not in result.stderr
    assert store_rows(cli.cwd / "qinglong.db") == before


def test_a_refusal_only_the_store_sees_names_the_line_and_writes_nothing(cli):
    """A trigger id another project holds is found inside the transaction; the plan pass finds
    it before the first write, so the file's other projects are not half applied."""
    _ok(cli("project", "create", "legacy"))
    _ok(cli("task", "put", "legacy", "t", "--", "/bin/true"))
    _ok(cli("trigger", "add", "legacy", "ops-hourly", "--task", "t", "--cron", "* * * * *"))
    before = store_rows(cli.cwd / "qinglong.db")
    _write(cli, "jobs.toml", GOOD)
    result = cli("apply", "jobs.toml", extra_env={"BACKUP_TOKEN": SECRET})
    assert result.returncode == 3
    assert "jobs.toml:21: projects.ops.triggers.ops-hourly: " in result.stderr, result.stderr
    assert "project 'legacy'" in result.stderr
    assert store_rows(cli.cwd / "qinglong.db") == before


def test_a_dry_run_writes_nothing_not_even_a_new_store(cli):
    """``--dry-run`` on a machine without a store must not create one (nor migrate one)."""
    _write(cli, "jobs.toml", GOOD)
    out = _ok(cli("apply", "jobs.toml", "--dry-run", extra_env={"BACKUP_TOKEN": SECRET}))
    assert "dry run:" in out and "+ trigger ops/ops-hourly" in out
    assert not (cli.cwd / "qinglong.db").exists()
    _ok(cli("apply", "jobs.toml", extra_env={"BACKUP_TOKEN": SECRET}))
    before = store_rows(cli.cwd / "qinglong.db")
    edited = GOOD.replace('"0 * * * *"', '"15 * * * *"')
    _write(cli, "jobs.toml", edited)
    out = json.loads(_ok(cli("apply", "jobs.toml", "--dry-run", "--json", extra_env={"BACKUP_TOKEN": SECRET})))
    assert out["applied"] is False and out["counts"]["update"] == 1
    assert store_rows(cli.cwd / "qinglong.db") == before


def test_prune_deletes_tasks_triggers_and_projects_the_file_does_not_name(cli):
    """Without ``--prune`` a removed job stays (partial files are safe); with it, the store
    matches the file, other projects included, within ``--project`` when given."""
    _ok(cli("project", "create", "legacy"))
    _write(cli, "jobs.toml", GOOD)
    _ok(cli("apply", "jobs.toml", extra_env={"BACKUP_TOKEN": SECRET}))
    smaller = (GOOD.split("[projects.ops.tasks.report]")[0]
               + "[projects.ops.triggers.ops-nightly]" + GOOD.split("[projects.ops.triggers.ops-nightly]")[1]
               .split("[projects.ops.triggers.ops-hourly]")[0])
    _write(cli, "small.toml", smaller)
    kept = _ok(cli("apply", "small.toml", extra_env={"BACKUP_TOKEN": SECRET}))
    assert "- " not in kept
    scoped = _ok(cli("apply", "small.toml", "--prune", "--project", "ops", extra_env={"BACKUP_TOKEN": SECRET}))
    assert "- trigger ops/ops-hourly" in scoped and "- task ops/report" in scoped
    assert "legacy" not in scoped
    pruned = _ok(cli("apply", "small.toml", "--prune", extra_env={"BACKUP_TOKEN": SECRET}))
    assert "- project legacy" in pruned
    listed = json.loads(_ok(cli("project", "list", "--json")))
    assert [p["project_id"] for p in listed] == ["ops"]


def test_env_values_from_files_and_secrets_and_inline_only_when_allowed(cli, tmp_path):
    """Secrets come from the environment, a file or the secrets directory; a value written in
    the file is refused unless asked for (it would end up in git)."""
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "db").write_text("db-pass\n")
    (cli.cwd / "token.txt").write_text("from-file")
    text = GOOD.replace('env = { TOKEN = "env:BACKUP_TOKEN" }',
                        'env = { TOKEN = "file:token.txt", DB = "secret:db", MODE = { value = "fast" } }')
    _write(cli, "jobs.toml", text)
    refused = cli("apply", "jobs.toml", extra_env={"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")})
    assert refused.returncode == 3 and "env.MODE" in refused.stderr
    _ok(cli("apply", "jobs.toml", "--allow-inline-env", extra_env={"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}))
    exported = _ok(cli("export", "--with-secrets"))
    assert 'TOKEN = { value = "from-file" }' in exported and 'DB = { value = "db-pass" }' in exported


def test_export_masks_values_and_applies_back_unchanged(cli):
    """An export is safe to commit (no value in it) and applying it changes nothing: the
    'stored:' markers keep what the store holds."""
    _write(cli, "jobs.toml", GOOD)
    _ok(cli("apply", "jobs.toml", extra_env={"BACKUP_TOKEN": SECRET}))
    before = store_rows(cli.cwd / "qinglong.db")
    exported = _ok(cli("export"))
    assert SECRET not in exported and 'TOKEN = "stored:"' in exported
    _write(cli, "exported.toml", exported)
    out = _ok(cli("apply", "exported.toml"))
    assert "nothing to change" in out
    assert store_rows(cli.cwd / "qinglong.db") == before
    with_secrets = _ok(cli("export", "--with-secrets", "--project", "ops"))
    assert f'TOKEN = {{ value = "{SECRET}" }}' in with_secrets
    missing = cli("export", "--project", "nope")
    assert missing.returncode == 3 and "nope" in missing.stderr


def test_a_trigger_jitter_applies_exports_and_applies_back_unchanged(cli):
    """A jitter the file names must reach the trigger, show in the plan when it changes, and
    survive export: lost on the way, every apply of an export would drop the delays (and reset
    the schedules)."""
    _write(cli, "jobs.toml", GOOD.replace('misfire_grace = "5m"', 'misfire_grace = "5m"\njitter = "10m"'))
    _ok(cli("apply", "jobs.toml", extra_env={"BACKUP_TOKEN": SECRET}))
    heads = {t["trigger_id"]: t for t in json.loads(_ok(cli("trigger", "list", "--json")))}
    assert (heads["ops-hourly"]["jitter_ms"], heads["ops-nightly"]["jitter_ms"]) == (600_000, 0)
    exported = _ok(cli("export"))
    assert "jitter_ms = 600000" in exported and exported.count("jitter_ms") == 1
    before = store_rows(cli.cwd / "qinglong.db")
    _write(cli, "exported.toml", exported)
    again = _ok(cli("apply", "exported.toml"))
    assert "nothing to change" in again
    assert store_rows(cli.cwd / "qinglong.db") == before
    _write(cli, "jobs.toml", GOOD.replace('misfire_grace = "5m"', 'misfire_grace = "5m"\njitter = "1m"'))
    changed = _ok(cli("apply", "jobs.toml", extra_env={"BACKUP_TOKEN": SECRET}))
    assert "~ trigger ops/ops-hourly (jitter_ms)" in changed
