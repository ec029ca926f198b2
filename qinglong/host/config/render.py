"""Writing the apply file format: what ``export`` prints and what an importer can emit.

Values are written as the store holds them (every execution value stated), so applying an
export changes nothing. Env values are masked unless asked for: a masked value is written
``"stored:"`` (keep what the store holds), so an export applies unchanged without ever holding
a secret; ``with_secrets`` writes ``{ value = "..." }``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping

from qinglong.contracts.apply import FORMAT_VERSION, ProjectState
from qinglong.contracts.execution import EXECUTION_KEYS
from qinglong.contracts.hooks import masked_spec

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes (valid TOML), with DEL escaped too (TOML forbids it raw)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_key(key: str) -> str:
    """A bare key when TOML allows one, else a quoted key."""
    return key if _BARE_KEY.match(key) else toml_string(key)


def toml_value(value: Any) -> str:
    """One TOML value on one line (tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".eE") or text in ("inf", "-inf", "nan") else text + ".0"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    if value is None:
        raise ValueError("TOML has no null")
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def task_table(payload: Mapping[str, Any], *, with_secrets: bool,
               masked_env: str = "stored:") -> list[tuple[str, Any]]:
    """The keys of a task's table, in a stable order, from its stored payload."""
    rows: list[tuple[str, Any]] = []
    for key in EXECUTION_KEYS:
        if key not in payload:
            continue
        value = payload[key]
        if key == "env" and isinstance(value, Mapping):
            value = {name: ({"value": v} if with_secrets else
                            (masked_env.replace("{NAME}", name) if "{NAME}" in masked_env else masked_env))
                     for name, v in value.items()}
        rows.append((key, value))
    if isinstance(payload.get("description"), str):
        rows.append(("description", payload["description"]))
    extra = {k: v for k, v in payload.items()
             if k not in EXECUTION_KEYS and not (k == "description" and isinstance(v, str))}
    if extra:
        rows.append(("payload", extra))
    return rows


def render_document(projects: Iterable[Mapping[str, Any]], *, header: Iterable[str] = ()) -> str:
    """The TOML text of projects given as ``{"project_id", "name", "tasks": {id: rows},
    "triggers": {id: rows}, "comments": {("tasks"|"triggers", id): [lines]}}``."""
    out = [f"# {line}".rstrip() for line in header]
    out += [f"version = {FORMAT_VERSION}"]
    for project in projects:
        pid = project["project_id"]
        out += ["", f"[projects.{toml_key(pid)}]"]
        if project.get("name") is not None:
            out.append(f"name = {toml_string(project['name'])}")
        comments = project.get("comments", {})
        for group in ("tasks", "triggers"):
            for object_id, rows in project.get(group, {}).items():
                out.append("")
                out += [f"# {line}".rstrip() for line in comments.get((group, object_id), ())]
                out.append(f"[projects.{toml_key(pid)}.{group}.{toml_key(object_id)}]")
                out += [f"{toml_key(k)} = {toml_value(v)}" for k, v in rows]
    return "\n".join(out) + "\n"


def export_projects(states: Iterable[ProjectState], *, with_secrets: bool) -> str:
    """``qinglong export``: the projects as an apply file."""
    projects = []
    for state in states:
        tasks = {task_id: task_table(record.payload, with_secrets=with_secrets)
                 for task_id, record in sorted(state.tasks.items())}
        triggers = {}
        for trigger_id, head in sorted(state.triggers.items()):
            spec = dict(head.spec) if with_secrets else masked_spec(head.spec)  # a hook's secret
            rows = [("task", head.task_id), ("kind", head.kind), ("spec", spec),
                    ("misfire_policy", head.misfire_policy.value),
                    ("misfire_grace_ms", head.misfire_grace_ms)]
            if head.jitter_ms:
                rows.append(("jitter_ms", head.jitter_ms))
            triggers[trigger_id] = rows + [("enabled", head.enabled)]
        projects.append({"project_id": state.project_id, "name": state.name, "tasks": tasks,
                         "triggers": triggers})
    header = ["Exported by `qinglong export`; apply with `qinglong apply FILE`."]
    if not with_secrets:
        header.append("Env values are masked: \"stored:\" keeps the value the store holds.")
        header.append("Trigger spec keys ending in secret are masked: give them back to apply.")
    return render_document(projects, header=header)
