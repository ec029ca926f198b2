"""``qinglong import qinglong-v2 DB``: a whyour/qinglong 2.x panel's database moved in.

The fixture database is built here with the stdlib ``sqlite3`` from the panel's published
schema: the Sequelize models ``back/data/cron.ts`` (table ``Crontabs``), ``back/data/env.ts``
(``Envs``), ``back/data/subscription.ts`` (``Subscriptions``), ``back/data/dependence.ts``
(``Dependences``) and ``back/data/system.ts`` (``Auths``) of whyour/qinglong, with the columns
``back/loaders/db.ts`` adds (``sub_id``, ``extra_schedules``, ``task_before``, ``task_after``), as
Sequelize creates them on SQLite (an ``id`` primary key, JSON as text, ``createdAt`` and
``updatedAt``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from qinglong.contracts.errors import UserError
from qinglong.host.config.qinglong_v2 import import_qinglong_v2
from qinglong.plugins.cron.provider import CronProvider

PROVIDERS = {"cron": CronProvider()}
NOW = "2026-01-20 08:00:00.000 +00:00"
COOKIE_A, COOKIE_B = "pt_key=AAA;pt_pin=a;", "pt_key=BBB;pt_pin=b;"

SCHEMA = """
CREATE TABLE `Crontabs` (`id` INTEGER PRIMARY KEY AUTOINCREMENT, `name` VARCHAR(255),
  `command` VARCHAR(255), `schedule` VARCHAR(255), `timestamp` VARCHAR(255), `saved` TINYINT(1),
  `status` NUMBER, `isSystem` NUMBER, `pid` NUMBER, `isDisabled` NUMBER, `isPinned` NUMBER,
  `log_path` VARCHAR(255), `labels` JSON, `last_running_time` NUMBER, `last_execution_time` NUMBER,
  `createdAt` DATETIME NOT NULL, `updatedAt` DATETIME NOT NULL, sub_id NUMBER, extra_schedules JSON,
  task_before TEXT, task_after TEXT, UNIQUE (`name`, `command`, `schedule`));
CREATE TABLE `Envs` (`id` INTEGER PRIMARY KEY AUTOINCREMENT, `value` VARCHAR(255),
  `timestamp` VARCHAR(255), `status` NUMBER, `position` NUMBER, `name` VARCHAR(255),
  `remarks` VARCHAR(255), `is_pinned` NUMBER, `createdAt` DATETIME NOT NULL,
  `updatedAt` DATETIME NOT NULL, UNIQUE (`value`, `name`));
CREATE TABLE `Subscriptions` (`id` INTEGER PRIMARY KEY AUTOINCREMENT, `name` VARCHAR(255),
  `url` VARCHAR(255), `schedule` VARCHAR(255), `interval_schedule` JSON, `type` VARCHAR(255),
  `whitelist` VARCHAR(255), `blacklist` VARCHAR(255), `status` NUMBER, `dependences` VARCHAR(255),
  `extensions` VARCHAR(255), `sub_before` VARCHAR(255), `sub_after` VARCHAR(255),
  `branch` VARCHAR(255), `pull_type` VARCHAR(255), `pull_option` JSON, `pid` NUMBER,
  `is_disabled` NUMBER, `log_path` VARCHAR(255), `schedule_type` VARCHAR(255),
  `alias` VARCHAR(255) UNIQUE, `createdAt` DATETIME NOT NULL, `updatedAt` DATETIME NOT NULL);
CREATE TABLE `Dependences` (`id` INTEGER PRIMARY KEY AUTOINCREMENT, `name` VARCHAR(255),
  `type` NUMBER, `timestamp` VARCHAR(255), `status` NUMBER, `log` JSON, `remark` VARCHAR(255),
  `createdAt` DATETIME NOT NULL, `updatedAt` DATETIME NOT NULL);
CREATE TABLE `Auths` (`id` INTEGER PRIMARY KEY AUTOINCREMENT, `ip` VARCHAR(255),
  `type` VARCHAR(255), `info` JSON, `createdAt` DATETIME NOT NULL, `updatedAt` DATETIME NOT NULL);
"""


def _cron(conn, id_, name, command, schedule, *, labels=(), disabled=0, system=0, extra=None,
          before=None, sub_id=None):
    conn.execute(
        "INSERT INTO Crontabs (id, name, command, schedule, saved, status, isSystem, isDisabled, "
        "isPinned, log_path, labels, createdAt, updatedAt, sub_id, extra_schedules, task_before) "
        "VALUES (?, ?, ?, ?, 0, 1, ?, ?, 0, '', ?, ?, ?, ?, ?, ?)",
        (id_, name, command, schedule, system, disabled, json.dumps(list(labels)), NOW, NOW, sub_id,
         json.dumps(extra) if extra is not None else None, before))


@pytest.fixture
def panel_db(tmp_path):
    path = tmp_path / "database.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    _cron(conn, 1, "京东签到", "task jd_sign.js", "15 7 * * *", labels=["jd"])
    _cron(conn, 2, "备份", "task backup/run.py now", "0 0 3 * * *", disabled=1,
          extra=[{"schedule": "30 12 * * *"}])
    _cron(conn, 3, "并发", "task jd_bean.js conc JD_COOKIE 1-2", "0 8 * * *")
    _cron(conn, 4, "拉库", "ql repo https://example.org/scripts.git", "0 1 * * *", sub_id=7)
    _cron(conn, 5, "通知", "curl -s \"$NOTIFY_URL?k=${PUSH_KEY}\"", "*/30 * * * *", before="echo hi")
    _cron(conn, 6, "删除日志", "ql rmlog 7", "5 23 */7 * *", system=1)
    _cron(conn, 7, "坏表达式", "task broken.js", "99 * * * *")
    for i, (name, value, status, position) in enumerate([
            ("JD_COOKIE", COOKIE_A, 0, 4500000000000000), ("JD_COOKIE", COOKIE_B, 0, 4490000000000000),
            ("PUSH_KEY", "push-secret", 0, 4480000000000000), ("OLD_KEY", "old", 1, 4470000000000000)]):
        conn.execute("INSERT INTO Envs (id, value, status, position, name, remarks, createdAt, updatedAt) "
                     "VALUES (?, ?, ?, ?, ?, '', ?, ?)", (i + 1, value, status, position, name, NOW, NOW))
    conn.execute("INSERT INTO Subscriptions (id, name, url, type, alias, createdAt, updatedAt) "
                 "VALUES (7, 'faker2', 'https://example.org/scripts.git', 'public-repo', 'faker2', ?, ?)", (NOW, NOW))
    conn.execute("INSERT INTO Dependences (id, name, type, status, createdAt, updatedAt) "
                 "VALUES (1, 'axios', 0, 1, ?, ?)", (NOW, NOW))
    conn.execute("INSERT INTO Auths (type, info, createdAt, updatedAt) VALUES ('notification', ?, ?, ?)",
                 (json.dumps({"type": "telegramBot", "telegramBotToken": "tg-token"}), NOW, NOW))
    conn.commit()
    conn.close()
    return path


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_panel_jobs_map_to_tasks_and_triggers_and_the_rest_is_listed_by_name(panel_db):
    """Every job the panel ran on a schedule moves in with its interpreter, directory, schedules
    (six fields keep their seconds), disabled state, name and tags; what cannot be carried is
    named, so nothing is lost without the operator being told. The file is never written."""
    before = _digest(panel_db)
    result = import_qinglong_v2(str(panel_db), project_id="panel", providers=PROVIDERS,
                                scripts_dir="/srv/ql/scripts", timezone="Asia/Shanghai")
    assert _digest(panel_db) == before
    project = result.data["projects"]["panel"]
    tasks, triggers = project["tasks"], project["triggers"]
    assert set(tasks) == {"cron-1", "cron-2", "cron-5"}
    assert tasks["cron-1"]["command"] == ["node", "jd_sign.js"]
    assert tasks["cron-1"]["working_dir"] == "/srv/ql/scripts"
    assert tasks["cron-1"]["description"] == "京东签到" and tasks["cron-1"]["payload"] == {"tags": ["jd"]}
    assert tasks["cron-2"]["command"] == ["python3", "run.py"]
    assert tasks["cron-2"]["working_dir"] == "/srv/ql/scripts/backup"
    assert tasks["cron-5"]["command"] == ["sh", "-c", "curl -s \"$NOTIFY_URL?k=${PUSH_KEY}\""]
    assert tasks["cron-5"]["env"] == {"PUSH_KEY": {"value": "push-secret"}}
    assert triggers["panel.cron-2"]["spec"] == {"expression": "0 0 3 * * *", "timezone": "Asia/Shanghai"}
    assert triggers["panel.cron-2"]["enabled"] is False and triggers["panel.cron-2-2"]["enabled"] is False
    assert triggers["panel.cron-2-2"]["spec"]["expression"] == "30 12 * * *"
    notes = "\n".join(result.notes)
    for expected in ("job 3 ('并发')", "job 4 ('拉库')", "job 5 ('通知'): its task_before", "job 6 ('删除日志')",
                     "job 7 ('坏表达式'): schedule '99 * * * *'", "subscription 7 ('faker2')",
                     "dependency 'axios'", "notification settings", "JD_COOKIE, OLD_KEY",
                     "script files themselves"):
        assert expected in notes, notes
    assert "tg-token" not in notes and COOKIE_A not in notes


def test_env_values_are_joined_as_the_panel_wrote_them(panel_db):
    """The panel exported a name's enabled values joined with '&' in its list order; a job
    naming JD_COOKIE must get the same string or its script reads other accounts."""
    conn = sqlite3.connect(panel_db)
    _cron(conn, 8, "豆子", "task jd_bean.js $JD_COOKIE", "0 9 * * *")
    conn.commit()
    conn.close()
    result = import_qinglong_v2(str(panel_db), project_id="panel", providers=PROVIDERS, timezone="UTC")
    task = result.data["projects"]["panel"]["tasks"]["cron-8"]
    assert task["env"] == {"JD_COOKIE": {"value": f"{COOKIE_A}&{COOKIE_B}"}}
    assert task["command"] == ["node", "jd_bean.js", "$JD_COOKIE"]


def test_a_file_that_is_not_a_panel_database_is_refused(tmp_path):
    """Importing another application's database must say so, not import nothing silently."""
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(UserError, match="no Crontabs table"):
        import_qinglong_v2(str(other), project_id="p", providers=PROVIDERS)
    with pytest.raises(UserError, match="no such file"):
        import_qinglong_v2(str(tmp_path / "missing.sqlite"), project_id="p", providers=PROVIDERS)


def test_the_cli_shows_the_plan_and_what_is_not_carried_then_applies(cli, panel_db):
    """One command moves the panel in: the plan before anything is written, the list of what
    stays behind, and no secret on the terminal."""
    result = cli("import", "qinglong-v2", str(panel_db), "--timezone", "Asia/Shanghai")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.index("+ task qinglong-v2/cron-1") < out.index("applied:")
    assert "note: not carried: subscription 7" in out
    assert "push-secret" not in out + result.stderr
    again = cli("import", "qinglong-v2", str(panel_db), "--timezone", "Asia/Shanghai")
    assert again.stdout.splitlines()[-1] == "nothing to change: the store already matches"
