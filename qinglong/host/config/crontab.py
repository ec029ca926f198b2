"""``qinglong import crontab``: a crontab as desired tasks and cron triggers, as cron runs it.

The semantics are Debian cron's crontab(5) (Vixie cron 3.0):

* blank lines and lines whose first non-blank character is ``#`` are ignored; the comment lines
  right above a job become its task's description (a comment that is itself a job line, a job
  commented out, is reported and not imported);
* ``NAME = value`` sets an environment variable for the jobs *below* it (spaces around ``=``
  optional, matching single or double quotes keep leading and trailing blanks); ``SHELL`` is the
  shell the jobs below run under (default ``/bin/sh``), ``HOME`` their working directory;
  ``CRON_TZ`` is the time zone of the jobs below; ``MAILTO`` (Qinglong sends no mail: its Runs
  keep their output, see ``qinglong logs``) and the other variables only cron reads are reported;
* a job is five time fields (or one of ``@yearly``, ``@annually``, ``@monthly``, ``@weekly``,
  ``@daily``, ``@midnight``, ``@hourly``, ``@reboot``), then, in ``/etc/crontab`` and
  ``/etc/cron.d`` files, a user, then the command, which runs as ``$SHELL -c command``;
* an unescaped ``%`` ends the command: the rest is the job's standard input, each further
  unescaped ``%`` a newline and a newline added at its end; ``\\%`` is a literal ``%`` (and in
  the command ``\\\\`` a single backslash). The input is given to the command through a
  here-document, which is what cron's pipe delivers;
* ``@reboot`` maps to the trigger kind ``at_start`` when a loaded plugin offers it; otherwise it
  is refused naming the line.

A refusal names the file and the line. Task ids are made from the program's name and a digest
of the line's meaning, so importing the same crontab again changes nothing.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from qinglong.contracts.errors import TriggerSpecError, UserError, quoted_path

from .locate import KeyLines

MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly", "@reboot")

#: The trigger kind a ``@reboot`` line becomes, when a plugin offers it.
AT_START_KIND = "at_start"

#: Variables only cron itself reads: reported, never passed to a job.
CRON_ONLY = ("MAILTO", "MAILFROM", "CRON_TZ", "CONTENT_TYPE", "CONTENT_TRANSFER_ENCODING", "RANDOM_DELAY")

#: Variables an emitted file writes as they are (they say where programs and files are, never a
#: secret); every other value is an ``env:NAME`` reference unless ``--with-secrets``.
PLAIN_ENV = ("SHELL", "PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ")

_ENV_LINE = re.compile(r"^([^\s=#][^\s=]*)[ \t]*=[ \t]*(.*)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POSIX_SHELLS = ("sh", "bash", "dash", "ash", "ksh", "mksh", "zsh", "busybox")


@dataclass
class ImportResult:
    """What an importer found: the apply document (as parsed TOML would be), where each object
    came from in the source, what could not be carried, and comments for ``--emit``."""

    source: str
    project_id: str
    data: dict[str, Any]
    lines: KeyLines
    notes: list[str] = field(default_factory=list)
    comments: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)

    def header(self) -> list[str]:
        """The first comment lines of an emitted file."""
        return ([f"Imported from {self.source} by `qinglong import`."] + self.summary
                + ["Apply with `qinglong apply --allow-inline-env FILE`: SHELL, PATH, HOME and the locale",
                   "variables are written as they are; other env values are env:NAME references."])

    def rendered(self, *, with_secrets: bool) -> dict[str, Any]:
        """The project as :func:`~qinglong.host.config.render.render_document` takes it; env
        values written as ``env:NAME`` references unless ``with_secrets``."""
        from .render import task_table

        project = self.data["projects"][self.project_id]
        tasks = {}
        for task_id, table in project.get("tasks", {}).items():
            payload = {k: v for k, v in table.items() if k not in ("timeout", "log_limit")}
            rows = task_table({k: v for k, v in payload.items() if k != "env"}, with_secrets=False)
            if "env" in payload:
                # what only says where programs are is written as it is; anything else may be a
                # secret, and is an env:NAME reference unless asked for
                env = {k: (v if with_secrets or k in PLAIN_ENV else f"env:{k}")
                       for k, v in ((k, v["value"]) for k, v in payload["env"].items())}
                env = {k: ({"value": v} if with_secrets or k in PLAIN_ENV else v) for k, v in env.items()}
                rows.insert(1, ("env", env))
            tasks[task_id] = rows
        triggers = {tid: list(t.items()) for tid, t in project.get("triggers", {}).items()}
        return {"project_id": self.project_id, "name": project.get("name"), "tasks": tasks,
                "triggers": triggers, "comments": self.comments}


def local_zone() -> str:
    """This machine's IANA time zone: ``$TZ`` when it names one, else ``/etc/localtime``'s
    target, else ``/etc/timezone``, else ``UTC``."""
    import os

    candidates = []
    tz = os.environ.get("TZ", "").lstrip(":")
    if tz:
        candidates.append(tz)
    try:
        target = os.readlink("/etc/localtime")
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    try:
        candidates.append(Path("/etc/timezone").read_text().strip())
    except OSError:
        pass
    for name in candidates:
        try:
            ZoneInfo(name)
            return name
        except (ZoneInfoNotFoundError, ValueError):
            continue
    return "UTC"


def _unquote(value: str) -> str:
    value = value.rstrip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def split_percent(command: str) -> tuple[str, str | None]:
    """The command and its standard input (None without an unescaped ``%``), as cron reads them.

    In the command, ``\\%`` is ``%`` and ``\\\\`` is ``\\``; other escapes stay. In the input
    each unescaped ``%`` is a newline, ``\\%`` is ``%``, other escapes stay, and a newline ends
    it when it does not end with one."""
    out: list[str] = []
    escaped = False
    rest: str | None = None
    for i, ch in enumerate(command):
        if escaped:
            if ch in "%\\":
                out[-1] = ch
            else:
                out.append(ch)
            escaped = False
            continue
        if ch == "\\":
            escaped = True
            out.append(ch)
            continue
        if ch == "%":
            rest = command[i + 1:]
            break
        out.append(ch)
    if rest is None:
        return "".join(out), None
    data: list[str] = []
    escaped = False
    for ch in rest:
        if escaped:
            if ch != "%":
                data.append("\\")
        elif ch == "%":
            ch = "\n"
        escaped = ch == "\\"
        if not escaped:
            data.append(ch)
    if escaped:
        data.append("\\")
    text = "".join(data)
    if text and not text.endswith("\n"):
        text += "\n"
    return "".join(out), text


def shell_argv(shell: str, command: str, stdin: str | None, where: str) -> list[str]:
    """``[shell, "-c", script]``: the command, fed ``stdin`` through a here-document when given."""
    if not stdin:
        return [shell, "-c", command]
    if Path(shell).name not in _POSIX_SHELLS:
        raise UserError(f"{where}: the job has standard input ('%'), which is given through a "
                        f"here-document, and SHELL={shell} is not a POSIX shell")
    delimiter = "QINGLONG_STDIN"
    lines = stdin[:-1].split("\n")
    n = 0
    while delimiter in lines:
        n += 1
        delimiter = f"QINGLONG_STDIN_{n}"
    return [shell, "-c", "{\n" + command + "\n} <<'" + delimiter + "'\n" + "\n".join(lines) + "\n" + delimiter]


def _slug(command: str) -> str:
    first = command.strip().split(None, 1)[0] if command.strip() else "job"
    name = Path(first).name.lower()
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")[:24]
    return slug if slug and slug[0].isalnum() else "job"


def _is_job_line(text: str) -> bool:
    words = text.split()
    if not words:
        return False
    if words[0].lower() in MACROS:
        return len(words) >= 2
    return len(words) >= 6 and all(re.match(r"^[0-9*,/\-A-Za-z]+$", w) for w in words[:5]) and \
        any(c.isdigit() or c == "*" for c in words[0])


def import_crontab(path: str, *, project_id: str, providers: Mapping[str, Any],
                   timezone: str | None = None, system: bool | None = None) -> ImportResult:
    """Read a crontab (``-``: standard input) into an :class:`ImportResult`; refusals name the
    file and the line."""
    if path == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"{quoted_path(path)}: cannot read the crontab: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise UserError(f"{quoted_path(path)}: not UTF-8 text") from None
        source = path
    if system is None:
        resolved = str(Path(path).resolve()) if path != "-" else ""
        system = resolved == "/etc/crontab" or resolved.startswith("/etc/cron.d/")
    return parse_crontab(text, source, project_id=project_id, providers=providers,
                         timezone=timezone, system=system)


def parse_crontab(text: str, source: str, *, project_id: str, providers: Mapping[str, Any],
                  timezone: str | None = None, system: bool = False) -> ImportResult:
    """The crontab ``text`` as desired tasks and triggers (see the module docstring)."""
    zone = timezone or local_zone()
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise UserError(f"--timezone {zone!r}: not an IANA time zone name") from None
    env: dict[str, str] = {}
    shell = "/bin/sh"
    cron_tz = zone
    pending: list[str] = []
    tasks: dict[str, dict[str, Any]] = {}
    triggers: dict[str, dict[str, Any]] = {}
    lines: dict[tuple[str, ...], int] = {}
    result = ImportResult(source, project_id, {}, KeyLines(lines))
    result.summary.append(f"Times are in {zone} unless CRON_TZ says otherwise"
                          f"{' (this machine' + chr(39) + 's zone; --timezone changes it)' if timezone is None else ''}.")
    users: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        where = f"{source}:{number}"
        line = raw.lstrip(" \t")
        if not line.strip():
            pending = []
            continue
        if line.startswith("#"):
            comment = line[1:].strip()
            if _is_job_line(comment) or (system and _is_job_line(" ".join(comment.split()[:5] + comment.split()[6:]))):
                result.notes.append(f"line {number}: a job commented out, not imported: {comment[:60]}")
                pending = []
            elif comment:
                pending.append(comment)
            continue
        match = _ENV_LINE.match(line)
        if match and not line.startswith("@") and not _is_job_line(line):
            name, value = match.group(1), _unquote(match.group(2))
            if name == "CRON_TZ":
                try:
                    ZoneInfo(value)
                except (ZoneInfoNotFoundError, ValueError):
                    raise UserError(f"{where}: CRON_TZ: {value!r} is not an IANA time zone name") from None
                cron_tz = value
            elif name in CRON_ONLY:
                result.notes.append(f"line {number}: {name} is read by cron only, not carried"
                                    + (" (Qinglong sends no mail; a Run's output is kept: `qinglong logs RUN`)"
                                       if name == "MAILTO" else ""))
            else:
                if not _ENV_NAME.match(name) or name.startswith("QINGLONG_"):
                    raise UserError(f"{where}: {name}: not a variable name a job can be given "
                                    "(letters, digits and _, not starting with a digit or QINGLONG_)")
                env[name] = value
                if name == "SHELL":
                    shell = value or "/bin/sh"
            pending = []
            continue
        words = line.split(None, 1)
        if words[0].startswith("@"):
            macro = words[0].lower()
            if macro not in MACROS:
                raise UserError(f"{where}: {words[0]}: not a schedule (expected five fields or one of "
                                f"{', '.join(MACROS)})")
            schedule, rest = macro, (words[1] if len(words) > 1 else "")
        else:
            parts = line.split(None, 5)
            if len(parts) < 6:
                raise UserError(f"{where}: expected five time fields and a command")
            schedule, rest = " ".join(parts[:5]), parts[5]
        user = None
        if system:
            bits = rest.split(None, 1)
            if len(bits) < 2:
                raise UserError(f"{where}: expected a user and a command after the schedule "
                                "(a system crontab; --system)")
            user, rest = bits
            users.add(user)
        if not rest.strip():
            raise UserError(f"{where}: the job has no command")
        command, stdin = split_percent(rest)
        argv = shell_argv(shell, command, stdin, where)
        if macro_is_reboot(schedule):
            if AT_START_KIND not in providers:
                raise UserError(f"{where}: @reboot: the trigger kind {AT_START_KIND!r} is not available "
                                f"(no loaded plugin offers it; kinds: {', '.join(sorted(providers)) or 'none'}); "
                                "remove the line or run the job another way")
            kind, spec = AT_START_KIND, {}
        else:
            cron = providers.get("cron")
            if cron is None:
                raise UserError(f"{where}: the cron trigger kind is not loaded")
            try:
                spec = dict(cron.validate({"expression": schedule, "timezone": cron_tz}))
            except TriggerSpecError as exc:
                raise UserError(f"{where}: {schedule!r}: {exc.problem}") from None
            kind = "cron"
        job_env = dict(env)
        meaning = repr((argv, sorted(job_env.items()), kind, spec, user))
        digest = hashlib.sha256(meaning.encode("utf-8")).hexdigest()[:8]
        task_id = f"{_slug(command)}-{digest}"
        n = 1
        while task_id in tasks:
            n += 1
            task_id = f"{_slug(command)}-{digest}-{n}"
        payload: dict[str, Any] = {"command": argv}
        if job_env:
            payload["env"] = {k: {"value": v} for k, v in job_env.items()}
        home = job_env.get("HOME")
        if home and home.startswith("/"):
            payload["working_dir"] = home
        description = "\n".join(pending) if pending else None
        if description:
            payload["description"] = description
            result.comments[("tasks", task_id)] = list(pending)
        tasks[task_id] = payload
        trigger_id = f"{project_id}.{task_id}"[:64]
        triggers[trigger_id] = {"task": task_id, "kind": kind, "spec": spec}
        for path in (("projects", project_id, "tasks", task_id), ("projects", project_id, "triggers", trigger_id)):
            lines[path] = number
        if user is not None:
            result.comments.setdefault(("triggers", trigger_id), []).append(f"cron ran it as user {user}")
        pending = []
    if users:
        result.notes.append(f"the crontab runs jobs as user(s) {', '.join(sorted(users))}; Qinglong runs "
                            "every job as the user it runs as")
    result.data = {"version": 1, "projects": {project_id: {"tasks": tasks, "triggers": triggers}}}
    return result


def macro_is_reboot(schedule: str) -> bool:
    """True for ``@reboot``."""
    return schedule == "@reboot"
