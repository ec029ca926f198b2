"""An apply file: parsed, checked key by key, its env values resolved, as desired projects.

The format (``docs/config-as-code.md``)::

    version = 1

    [projects.ops]
    name = "Operations"

    [projects.ops.tasks.backup]
    command = ["/usr/local/bin/backup.sh", "--verbose"]
    timeout = "30m"                      # or timeout_ms = 1800000
    env = { TOKEN = "env:BACKUP_TOKEN", DB_PASSWORD = "file:/run/secrets/db" }

    [projects.ops.triggers.nightly]
    task = "backup"
    kind = "cron"
    spec = { expression = "30 2 * * *", timezone = "Europe/Berlin" }

Every refusal is a :class:`ConfigError` naming the file, the line and the key, raised before
anything is written; no env value is ever part of one. Env values come from ``env:NAME`` (the
environment of the command), ``file:PATH`` (relative to the file), ``secret:NAME`` (a file of
the secrets directory: ``$CREDENTIALS_DIRECTORY``, as systemd's ``LoadCredential=`` sets it, or
``--secrets-dir``), ``stored:`` (the value the store holds now, what ``export`` writes) or, only
when the caller allows inline values, ``{ value = "..." }``.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from qinglong.contracts.frozen import record
from qinglong.contracts.apply import FORMAT_VERSION, STORED, DesiredProject, ObjectKind, PlanRefused
from qinglong.contracts.errors import UserError, quoted_path
from qinglong.contracts.execution import EXECUTION_KEYS, ExecutionLimits, parse_execution_spec, spec_to_payload
from qinglong.contracts.records import DEFAULT_MISFIRE_GRACE_MS, MisfirePolicy, TriggerDefinition
from qinglong.contracts.store import check_identifier, check_project_name

from .. import tomlfile
from .locate import KeyLines, locate_keys

#: Most bytes of one apply file, and of one env value read from a file.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_ENV_FILE_BYTES = 64 * 1024

TASK_KEYS = ("command", "env", "working_dir", "timeout", "timeout_ms", "concurrency", "retry",
             "idempotent", "log_limit", "log_limit_bytes", "executor", "labels", "description",
             "payload")
TRIGGER_KEYS = ("task", "kind", "spec", "misfire_policy", "misfire_grace", "misfire_grace_ms", "jitter",
                "jitter_ms", "enabled")
PROJECT_KEYS = ("name", "tasks", "triggers")


class ConfigError(UserError):
    """A refusal of an apply file: ``FILE:LINE: KEY: problem``."""

    def __init__(self, source: str, line: int, key: str, problem: str) -> None:
        self.source = source
        self.line = line
        self.key = key
        self.problem = problem
        super().__init__(f"{source}:{line}: {key}: {problem}")


@record(slots=False)
class EnvSources:
    """Where env values come from: the environment, files, a secrets directory, inline."""

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    base_dir: Path = Path(".")
    secrets_dir: Path | None = None
    allow_inline: bool = False


@dataclass
class Document:
    """A checked apply file: its desired projects by id and where each key was written."""

    source: str
    projects: dict[str, DesiredProject]
    lines: KeyLines
    #: the file key each payload key came from, per task: (project, task) -> {payload key: file key}
    task_keys: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    #: the file key each trigger field came from: (project, trigger) -> {field: file key}
    trigger_keys: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    def error(self, path: Sequence[str], problem: str) -> ConfigError:
        """A refusal naming the line of ``path`` and the key as dotted text."""
        return ConfigError(self.source, self.lines.line_of(path), ".".join(path), problem)

    def refusal(self, refused: PlanRefused) -> ConfigError:
        """A store's or a contract's refusal of one object, named by its line in this file."""
        base = ["projects", refused.project_id]
        if refused.kind is ObjectKind.PROJECT:
            path = base + ([refused.key] if refused.key == "name" else [])
        else:
            group = "tasks" if refused.kind is ObjectKind.TASK else "triggers"
            path = base + [group, refused.object_id]
            mapping = (self.task_keys if refused.kind is ObjectKind.TASK else self.trigger_keys).get(
                (refused.project_id, refused.object_id), {})
            head, _, rest = refused.key.partition(".")
            if refused.key not in ("id", "payload", "trigger"):
                path += [mapping.get(head, head)] + ([rest] if rest else [])
        return self.error(path, refused.problem)


def _type_name(value: Any) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)


class _Checker:
    """Reads one parsed file, refusing with the line of the key at fault."""

    def __init__(self, doc: Document, sources: EnvSources, limits: ExecutionLimits,
                 parse_duration: Callable[[str, str], int], parse_size: Callable[[str, str], int]) -> None:
        self.doc = doc
        self.sources = sources
        self.limits = limits
        self.parse_duration = parse_duration
        self.parse_size = parse_size

    def fail(self, path: Sequence[str], problem: str) -> ConfigError:
        return self.doc.error(path, problem)

    def table(self, value: Any, path: Sequence[str], allowed: Sequence[str] | None = None) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a table, got {_type_name(value)}")
        if allowed is not None:
            for key in value:
                if key not in allowed:
                    raise self.fail([*path, key], f"unknown key (expected one of {', '.join(allowed)})")
        return value

    def string(self, value: Any, path: Sequence[str]) -> str:
        if not isinstance(value, str):
            raise self.fail(path, f"expected a string, got {_type_name(value)}")
        return value

    def identifier(self, value: str, path: Sequence[str], label: str) -> str:
        try:
            check_identifier(label, value)
        except UserError as exc:
            raise self.fail(path, str(exc)) from None
        return value

    # ---- env values ------------------------------------------------------------------------
    def env_value(self, value: Any, path: Sequence[str]) -> Any:
        name = path[-1]
        if isinstance(value, dict):
            self.table(value, path, ("value",))
            if "value" not in value:
                raise self.fail(path, "an inline value is written { value = \"...\" }")
            text = self.string(value["value"], [*path, "value"])
            if not self.sources.allow_inline:
                raise self.fail(path, "an inline env value needs --allow-inline-env (values written "
                                      "in the file end up in git); prefer env:NAME, file:PATH or secret:NAME")
            return text
        text = self.string(value, path)
        scheme, sep, rest = text.partition(":")
        if not sep or scheme not in ("env", "file", "secret", "stored"):
            raise self.fail(path, "expected env:NAME, file:PATH, secret:NAME or stored: (an inline "
                                  "value is written { value = \"...\" } and needs --allow-inline-env); "
                                  "the text given is not shown")
        if scheme == "stored":
            if rest:
                raise self.fail(path, "'stored:' takes nothing after the colon")
            return STORED
        if scheme == "env":
            if not rest:
                raise self.fail(path, "env: needs the name of a variable of this command's environment")
            if rest not in self.sources.environ:
                raise self.fail(path, f"the environment variable {rest} is not set")
            return self.sources.environ[rest]
        if scheme == "secret":
            directory = self.sources.secrets_dir
            if directory is None:
                raise self.fail(path, "secret:NAME reads the secrets directory: set "
                                      "$CREDENTIALS_DIRECTORY (systemd LoadCredential=) or give --secrets-dir")
            if not rest or "/" in rest or rest in (".", ".."):
                raise self.fail(path, "secret: needs a file name of the secrets directory (no '/')")
            return self._read(directory / rest, path, f"secret {rest!r}")
        if not rest:
            raise self.fail(path, "file: needs a path")
        target = Path(rest)
        if not target.is_absolute():
            target = self.sources.base_dir / target
        return self._read(target, path, f"file {str(target)!r}")

    def _read(self, target: Path, path: Sequence[str], label: str) -> str:
        try:
            with open(target, "rb") as f:
                data = f.read(MAX_ENV_FILE_BYTES + 1)
        except OSError as exc:
            raise self.fail(path, f"cannot read {label}: {exc.strerror}") from None
        if len(data) > MAX_ENV_FILE_BYTES:
            raise self.fail(path, f"{label} is over {MAX_ENV_FILE_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(path, f"{label} is not UTF-8 text") from None
        # one trailing newline is the file's end, not the value's (as `$(cat file)` reads it)
        return text[:-1] if text.endswith("\n") else text

    # ---- tasks and triggers ----------------------------------------------------------------
    def task(self, project_id: str, task_id: str, value: Any) -> dict[str, Any]:
        path = ["projects", project_id, "tasks", task_id]
        self.identifier(task_id, path, "task_id")
        raw = self.table(value, path, TASK_KEYS)
        origin: dict[str, str] = {}
        payload: dict[str, Any] = {}
        if "payload" in raw:
            extra = self.table(raw["payload"], [*path, "payload"])
            for key in extra:
                if key in EXECUTION_KEYS or (key == "description" and "description" in raw):
                    raise self.fail([*path, "payload", key], f"{key!r} is a key of the task itself; "
                                    "write it beside command, not under payload")
                payload[key] = extra[key]
                origin[key] = f"payload.{key}"
        for pair in (("timeout", "timeout_ms"), ("log_limit", "log_limit_bytes")):
            if pair[0] in raw and pair[1] in raw:
                raise self.fail([*path, pair[0]], f"give {pair[0]} or {pair[1]}, not both")
        for key, item in raw.items():
            if key == "payload":
                continue
            if key == "env":
                env = self.table(item, [*path, "env"])
                payload["env"] = {name: self.env_value(v, [*path, "env", name]) for name, v in env.items()}
            elif key == "timeout":
                payload["timeout_ms"] = self._converted(self.parse_duration, item, [*path, key])
            elif key == "log_limit":
                payload["log_limit_bytes"] = self._converted(self.parse_size, item, [*path, key])
            elif key == "description":
                payload["description"] = self.string(item, [*path, key])
            else:
                payload[key] = item
            origin[{"timeout": "timeout_ms", "log_limit": "log_limit_bytes"}.get(key, key)] = key
        self.doc.task_keys[(project_id, task_id)] = origin
        placeholder = dict(payload)
        if isinstance(payload.get("env"), dict):
            placeholder["env"] = {k: ("" if v is STORED else v) for k, v in payload["env"].items()}
        try:
            spec = parse_execution_spec(task_id, placeholder, self.limits)
        except UserError as exc:
            text = str(exc)
            prefix = f"task {task_id!r}: "
            rest = text[len(prefix):] if text.startswith(prefix) else text
            key, _, problem = rest.partition(": ")
            head, _, tail = key.partition(".")
            if head in origin or head in EXECUTION_KEYS:
                where = [*path, origin.get(head, head)] + ([tail] if tail else [])
                raise self.fail(where, problem or rest) from None
            raise self.fail(path, rest) from None
        if spec is None:
            return payload
        stated = {key: item for key, item in payload.items() if key not in EXECUTION_KEYS}
        stated.update(spec_to_payload(spec))
        if spec.env:
            stated["env"] = dict(payload["env"])  # STORED markers stay until the store resolves them
        return stated

    def _converted(self, parse: Callable[[str, str], int], value: Any, path: Sequence[str]) -> int:
        text = self.string(value, path)
        try:
            return parse(path[-1], text)
        except UserError as exc:
            message = str(exc)
            raise self.fail(path, message.split(": ", 1)[-1]) from None

    def trigger(self, project_id: str, trigger_id: str, value: Any) -> TriggerDefinition:
        path = ["projects", project_id, "triggers", trigger_id]
        self.identifier(trigger_id, path, "trigger_id")
        raw = self.table(value, path, TRIGGER_KEYS)
        for key in ("task", "kind", "spec"):
            if key not in raw:
                raise self.fail(path, f"a trigger needs {key!r}")
        task = self.identifier(self.string(raw["task"], [*path, "task"]), [*path, "task"], "task")
        kind = self.string(raw["kind"], [*path, "kind"])
        spec = self.table(raw["spec"], [*path, "spec"])
        origin = {"task": "task", "kind": "kind", "spec": "spec"}
        policy = raw.get("misfire_policy", MisfirePolicy.FIRE_ONCE.value)
        try:
            policy = MisfirePolicy(self.string(policy, [*path, "misfire_policy"]))
        except ValueError:
            raise self.fail([*path, "misfire_policy"], "expected 'fire_once' or 'skip'") from None
        if "misfire_grace" in raw and "misfire_grace_ms" in raw:
            raise self.fail([*path, "misfire_grace"], "give misfire_grace or misfire_grace_ms, not both")
        if "misfire_grace" in raw:
            grace = self._converted(self.parse_duration, raw["misfire_grace"], [*path, "misfire_grace"])
            origin["misfire_grace_ms"] = "misfire_grace"
        else:
            grace = raw.get("misfire_grace_ms", DEFAULT_MISFIRE_GRACE_MS)
            if not isinstance(grace, int) or isinstance(grace, bool):
                raise self.fail([*path, "misfire_grace_ms"], f"expected an integer, got {_type_name(grace)}")
        if "jitter" in raw and "jitter_ms" in raw:
            raise self.fail([*path, "jitter"], "give jitter or jitter_ms, not both")
        if "jitter" in raw:
            jitter = self._converted(self.parse_duration, raw["jitter"], [*path, "jitter"])
            origin["jitter_ms"] = "jitter"
        else:
            jitter = raw.get("jitter_ms", 0)
            if not isinstance(jitter, int) or isinstance(jitter, bool):
                raise self.fail([*path, "jitter_ms"], f"expected an integer, got {_type_name(jitter)}")
        enabled = raw.get("enabled", True)
        if not isinstance(enabled, bool):
            raise self.fail([*path, "enabled"], f"expected true or false, got {_type_name(enabled)}")
        self.doc.trigger_keys[(project_id, trigger_id)] = origin
        return TriggerDefinition(project_id, trigger_id, task, kind, spec, policy, grace, enabled,
                                 jitter)


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """The TOML text parsed, or a :class:`ConfigError` naming the line tomllib stopped at."""
    try:
        return tomlfile.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        line = 1
        marker = "(at line "
        if marker in message:
            try:
                line = int(message.split(marker, 1)[1].split(",", 1)[0])
            except ValueError:
                pass
        raise ConfigError(source, line, "(syntax)", message.split(" (at line", 1)[0]) from None


def read_source(path: str) -> tuple[str, str, Path]:
    """The text, the name to report and the directory of an apply file (``-``: standard input)."""
    import sys

    if path == "-":
        return sys.stdin.read(MAX_FILE_BYTES + 1), "<stdin>", Path.cwd()
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{quoted_path(path)}: cannot read the file: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise UserError(f"{path}: over {MAX_FILE_BYTES} bytes; split it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(path, line, "(encoding)", "not UTF-8 text") from None
    return text, path, Path(path).resolve().parent


def load_document(text: str, source: str, sources: EnvSources, limits: ExecutionLimits, *,
                  parse_duration: Callable[[str, str], int],
                  parse_size: Callable[[str, str], int],
                  data: Mapping[str, Any] | None = None) -> Document:
    """Check an apply file and resolve its env values; :class:`ConfigError` on the first fault.

    ``data`` is the already parsed document when the caller has it (an importer builds one);
    ``text`` is then used only to locate keys (it may be empty).
    """
    parsed = parse_toml(text, source) if data is None else dict(data)
    doc = Document(source, {}, locate_keys(text) if text else KeyLines({}))
    checker = _Checker(doc, sources, limits, parse_duration, parse_size)
    checker.table(parsed, [], ("version", "projects"))
    version = parsed.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise doc.error(["version"], f"this Qinglong reads version {FORMAT_VERSION}, the file says {version!r}")
    projects = checker.table(parsed.get("projects", {}), ["projects"])
    owners: dict[str, str] = {}
    for project_id, value in projects.items():
        path = ["projects", project_id]
        checker.identifier(project_id, path, "project_id")
        raw = checker.table(value, path, PROJECT_KEYS)
        name = raw.get("name")
        if name is not None:
            name = checker.string(name, [*path, "name"])
            try:
                check_project_name(name)
            except UserError as exc:
                raise doc.error([*path, "name"], str(exc)) from None
        tasks = {task_id: checker.task(project_id, task_id, item)
                 for task_id, item in checker.table(raw.get("tasks", {}), [*path, "tasks"]).items()}
        triggers: dict[str, TriggerDefinition] = {}
        for trigger_id, item in checker.table(raw.get("triggers", {}), [*path, "triggers"]).items():
            if trigger_id in owners:
                raise doc.error([*path, "triggers", trigger_id],
                                f"trigger ids are unique across projects; project {owners[trigger_id]!r} "
                                "declares it too")
            owners[trigger_id] = project_id
            definition = checker.trigger(project_id, trigger_id, item)
            if definition.task_id not in tasks:
                raise doc.error([*path, "triggers", trigger_id, "task"],
                                f"task {definition.task_id!r} is not declared in project {project_id!r}")
            triggers[trigger_id] = definition
        doc.projects[project_id] = DesiredProject(project_id, name, tasks, triggers)
    return doc
