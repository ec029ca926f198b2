"""``qinglong import qinglong-v2 DB``: a whyour/qinglong 2.x panel's jobs, from its SQLite file.

The panel (Sequelize on SQLite, ``/ql/data/db/database.sqlite``) keeps its jobs in the
``Crontabs`` table (``back/data/cron.ts``: ``name``, ``command``, ``schedule`` of 5 fields or 6
with seconds first, ``labels`` as JSON, ``isDisabled``, ``extra_schedules`` as JSON,
``task_before``/``task_after``, ``sub_id``, ``isSystem``) and its environment variables in
``Envs`` (``back/data/env.ts``: ``name``, ``value``, ``status`` 0 enabled, ``position``). The
file is opened read-only and never written.

What each job becomes:

* ``task FILE [ARGS]`` with FILE ending in ``.js``, ``.py``/``.pyc``, ``.sh`` or ``.ts`` runs
  the interpreter the panel's ``task`` command picks (``node``, ``python3``, ``bash``,
  ``ts-node-transpile-only``) on FILE, in the scripts directory (``--scripts-dir``, default the
  panel's ``/ql/data/scripts``; a FILE in a subdirectory runs there). ``now`` after FILE is
  dropped (it only skips the panel's random delay, which Qinglong does not add). ``conc`` and
  ``desi`` (one process per account) are not carried. Another FILE is run as a program.
* ``ql ...`` commands are the panel's own maintenance: not carried.
* Any other command runs as ``sh -c COMMAND`` in the scripts directory.
* A variable the command names (``$NAME``, ``${NAME}``) that ``Envs`` holds becomes the task's
  env, its enabled values joined with ``&`` in the panel's order, as its ``env.sh`` wrote them.
* schedules are in the panel's time zone: its system settings' ``timezone``, else
  ``Asia/Shanghai`` (its image's ``TZ``), unless ``--timezone`` says otherwise;
* ``schedule`` and each ``extra_schedules`` entry become cron triggers (six fields keep seconds
  first, as Qinglong's cron does), disabled when ``isDisabled`` is 1; ``name`` becomes the
  description; ``labels`` are kept as the payload's ``tags`` (they are the panel's tags, not the
  labels a cluster worker must offer).

Listed as not carried, by name: the jobs above, ``task_before``/``task_after`` snippets, system
jobs, subscriptions (``Subscriptions``), dependencies (``Dependences``), notification settings
(``Auths`` of type ``notification``), the variables no command names, and the script files
themselves (they are not in the database).
"""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
from pathlib import Path, PurePosixPath
from typing import Any, Mapping
from urllib.parse import quote

from qinglong.contracts.errors import TriggerSpecError, UserError

from .crontab import ImportResult
from .locate import KeyLines

#: The interpreter the panel's ``task`` command runs a file of each extension with.
INTERPRETERS = {".js": "node", ".py": "python3", ".pyc": "python3", ".sh": "bash",
                ".ts": "ts-node-transpile-only"}

_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _open_read_only(path: str) -> sqlite3.Connection:
    if not Path(path).is_file():
        raise UserError(f"{path}: no such file (the panel keeps /ql/data/db/database.sqlite)")
    try:
        conn = sqlite3.connect(f"file:{quote(str(Path(path).resolve()))}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise UserError(f"{path}: not a readable SQLite database ({exc})") from None
    return conn


def _tables(conn: sqlite3.Connection) -> dict[str, set[str]]:
    found = {}
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        found[name] = {row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')}
    return found


def _json_list(text: Any) -> list:
    if text is None or text == "":
        return []
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _command(command: str, scripts_dir: str) -> tuple[list[str] | None, str | None, str | None]:
    """(argv, working_dir, why not carried)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    if not words:
        return None, None, "an empty command"
    if words[0] == "ql":
        return None, None, f"the panel's own command ({' '.join(words[:2])})"
    if words[0] != "task":
        return ["sh", "-c", command], scripts_dir, None
    if len(words) < 2:
        return None, None, "'task' without a file"
    file, args = words[1], words[2:]
    if args[:1] in (["conc"], ["desi"]):
        return None, None, f"'task FILE {args[0]}' runs one process per account"
    if args[:1] == ["now"]:
        args = args[1:]
    where = PurePosixPath(file)
    workdir = scripts_dir
    if not where.is_absolute() and len(where.parts) > 1:
        workdir = str(PurePosixPath(scripts_dir) / where.parent)
        file = where.name
    program = INTERPRETERS.get(PurePosixPath(file).suffix)
    argv = ([program, file] if program else [file if "/" in file else f"./{file}"]) + args
    return argv, workdir, None


def import_qinglong_v2(path: str, *, project_id: str, providers: Mapping[str, Any],
                       scripts_dir: str = "/ql/data/scripts", timezone: str | None = None) -> ImportResult:
    """Read a whyour/qinglong 2.x database into an :class:`ImportResult` (see the module)."""
    conn = _open_read_only(path)
    try:
        tables = _tables(conn)
        if "Crontabs" not in tables:
            raise UserError(f"{path}: no Crontabs table: not a whyour/qinglong 2.x database")
        columns = tables["Crontabs"]
        envs: dict[str, list[str]] = {}
        disabled_envs: set[str] = set()
        if "Envs" in tables:
            order = "position DESC, createdAt ASC" if {"position", "createdAt"} <= tables["Envs"] else "id"
            for row in conn.execute(f"SELECT name, value, status FROM Envs ORDER BY {order}"):
                if not row["name"]:
                    continue
                if row["status"] in (0, None):
                    envs.setdefault(row["name"], []).append(row["value"] or "")
                else:
                    disabled_envs.add(row["name"])
        wanted = [c for c in ("id", "name", "command", "schedule", "labels", "isDisabled", "isSystem",
                              "extra_schedules", "task_before", "task_after", "sub_id") if c in columns]
        rows = conn.execute(f"SELECT {', '.join(wanted)} FROM Crontabs ORDER BY id").fetchall()
        result = ImportResult(path, project_id, {}, KeyLines({}))
        zone, why_zone = timezone, "--timezone"
        if zone is None and "Auths" in tables and {"type", "info"} <= tables["Auths"]:
            for (info,) in conn.execute("SELECT info FROM Auths WHERE type = 'systemConfig'"):
                try:
                    zone = (json.loads(info) or {}).get("timezone") or None
                except (TypeError, ValueError, AttributeError):
                    zone = None
                why_zone = "the panel's system settings"
        if zone is None:
            zone, why_zone = "Asia/Shanghai", "the panel's image default (TZ); --timezone changes it"
        cron = providers.get("cron")
        if cron is None:
            raise UserError("the cron trigger kind is not loaded")
        tasks: dict[str, dict[str, Any]] = {}
        triggers: dict[str, dict[str, Any]] = {}
        used: set[str] = set()
        not_carried: list[str] = []
        for row in rows:
            row = dict(row)
            label = f"job {row['id']} ({row.get('name') or row['command']!r})"
            if row.get("isSystem") == 1:
                not_carried.append(f"{label}: a system job of the panel")
                continue
            argv, workdir, why = _command((row.get("command") or "").strip(), scripts_dir)
            if argv is None:
                not_carried.append(f"{label}: {why}")
                continue
            schedules = [row.get("schedule") or ""] + [
                e.get("schedule", "") for e in _json_list(row.get("extra_schedules")) if isinstance(e, dict)]
            specs = []
            for schedule in schedules:
                try:
                    specs.append(dict(cron.validate({"expression": schedule.strip(), "timezone": zone})))
                except TriggerSpecError as exc:
                    not_carried.append(f"{label}: schedule {schedule!r}: {exc.problem}")
            if not specs:
                continue
            task_id = f"cron-{row['id']}"
            payload: dict[str, Any] = {"command": argv, "working_dir": workdir}
            named = {a or b for a, b in _VARIABLE.findall(row.get("command") or "")}
            env = {name: {"value": "&".join(envs[name])} for name in sorted(named) if name in envs}
            used.update(env)
            if env:
                payload["env"] = env
            if row.get("name"):
                payload["description"] = str(row["name"])
            tags = [str(t) for t in _json_list(row.get("labels"))]
            if tags:
                payload["payload"] = {"tags": tags}
            tasks[task_id] = payload
            for n, spec in enumerate(specs):
                trigger_id = f"{project_id}.{task_id}" + (f"-{n + 1}" if n else "")
                triggers[trigger_id[:64]] = {"task": task_id, "kind": "cron", "spec": spec,
                                             "enabled": row.get("isDisabled") != 1}
            for hook in ("task_before", "task_after"):
                if (row.get(hook) or "").strip():
                    not_carried.append(f"{label}: its {hook} commands")
            if row.get("sub_id"):
                result.notes.append(f"{label}: added by subscription {row['sub_id']}; the subscription "
                                    "itself is not carried")
        if "Subscriptions" in tables:
            for row in conn.execute("SELECT * FROM Subscriptions ORDER BY id"):
                not_carried.append(f"subscription {row['id']} ({row['name'] or row['url']!r})")
        if "Dependences" in tables:
            for row in conn.execute("SELECT * FROM Dependences ORDER BY id"):
                not_carried.append(f"dependency {row['name']!r} (install it on this machine)")
        if "Auths" in tables and "type" in tables["Auths"]:
            if conn.execute("SELECT 1 FROM Auths WHERE type = 'notification' LIMIT 1").fetchone():
                not_carried.append("the panel's notification settings")
        unused = sorted((set(envs) | disabled_envs) - used)
        if unused:
            not_carried.append("environment variables no command names (a script may read them; add "
                               "them to its task's env): " + ", ".join(unused))
        not_carried.append(f"the script files themselves: copy the panel's scripts to {scripts_dir}")
    finally:
        conn.close()
    result.notes += [f"not carried: {item}" for item in not_carried]
    result.summary.append(f"Schedules are in {zone} ({why_zone}).")
    result.data = {"version": 1, "projects": {project_id: {"tasks": tasks, "triggers": triggers}}}
    return result
