"""The remote CLI: ``qinglong --api URL ...`` runs the read and write commands through the
management API instead of the store, with the same output and exit codes. :class:`RemoteBackend`
stands where a backend stands (publisher, reader, execution store, run control), speaking HTTP with
the standard library's client; an API error is raised as the error type its code names, so it
exits with that type's code."""

from __future__ import annotations

import http.client
import json
import os
import ssl
from typing import Any, Mapping, Sequence
from urllib.parse import quote, urlencode, urlsplit

from qinglong.contracts.errors import AlreadyExists, NotFound, StoreUnavailable, UserError, quoted
from qinglong.contracts.execution import AttemptState, RunState
from qinglong.contracts.execution.control import StoredLogState
from qinglong.contracts.execution.store import AttemptView, RunDetail, RunSummary
from qinglong.contracts.records import MisfirePolicy, ProjectRecord, TaskRecord, TriggerHead

#: The API's error codes, as the CLI's error types (and so its exit codes).
ERRORS: Mapping[str, type[Exception]] = {
    "unknown": NotFound, "conflict": AlreadyExists, "invalid": UserError, "unavailable": StoreUnavailable,
    "schema_not_ready": StoreUnavailable,
}


def api_target(args: Any) -> tuple[str, str] | None:
    """``(url, token)`` when the command line (``--api``, ``--token-file``) or the environment
    (``QINGLONG_API_URL``, ``QINGLONG_API_TOKEN``) names an API; None to use the store."""
    url = getattr(args, "api", None) or os.environ.get("QINGLONG_API_URL")
    if not url:
        return None
    from .settings import http_url_problem

    if http_url_problem(url) is not None:
        raise UserError(f"--api: expected http://HOST:PORT or https://HOST:PORT, got {quoted(url)}")
    token_file = getattr(args, "token_file", None)
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise UserError(f"--token-file {token_file}: {exc.strerror}") from None
    else:
        token = os.environ.get("QINGLONG_API_TOKEN", "").strip()
    if not token:
        raise UserError("the API needs a token: set QINGLONG_API_TOKEN or pass --token-file PATH")
    return url.rstrip("/"), token


class ApiClient:
    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._base = parts.path.rstrip("/")
        self._token = token
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=60,
                                                         context=ssl.create_default_context())
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=60)
        return self._conn

    def call(self, method: str, path: str, body: Any = None, *, query: Mapping[str, Any] | None = None,
             headers: Mapping[str, str] | None = None, raw: bool = False) -> Any:
        target = self._base + "/api/v1" + path
        if query:
            target += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        sent = {"Authorization": f"Bearer {self._token}", **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        try:
            conn = self._connection()
            conn.request(method, target, body=data, headers=sent)
            response = conn.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise StoreUnavailable(f"cannot reach the API at {self.url}: {exc.__class__.__name__}") from None
        if response.status >= 400:
            try:
                error = json.loads(payload)["error"]
                code, message = error["code"], error["message"]
            except (ValueError, KeyError, TypeError):
                code, message = "invalid", payload[:200].decode("utf-8", "replace")
            if code in ERRORS:
                raise ERRORS[code](message)
            raise UserError(f"the API refused ({response.status} {code}): {message}")
        if raw:
            return payload, response
        return json.loads(payload) if payload else None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _q(text: str) -> str:
    return quote(text, safe="")


def _project(d: Mapping[str, Any]) -> ProjectRecord:
    return ProjectRecord(d["project_id"], d["name"], d["active"])


def _trigger(d: Mapping[str, Any]) -> TriggerHead:
    return TriggerHead(d["project_id"], d["trigger_id"], d["task_id"], d["trigger_revision"], d["kind"], d["spec"],
                       MisfirePolicy(d["misfire_policy"]), d["misfire_grace_ms"], d["enabled"], d["content_digest"],
                       d.get("jitter_ms", 0))


def _summary(d: Mapping[str, Any]) -> RunSummary:
    return RunSummary(d["run_id"], d["project_id"], d["task_id"], d["trigger_id"], d["scheduled_for_ms"],
                      d["admitted_at_ms"], RunState(d["state"]), d["attempts"], d["exit_code"], d["duration_ms"],
                      d["finished_at_ms"], d["reason"])


def _attempt(d: Mapping[str, Any]) -> AttemptView:
    return AttemptView(d["attempt_id"], d["attempt_no"], AttemptState(d["state"]), d["executor"], d["created_at_ms"],
                       d["not_before_ms"], d["started_at_ms"], d["finished_at_ms"], d["exit_code"], d["signal"],
                       d["duration_ms"], d["log_bytes"], d["log_dropped_bytes"], d["log_deleted"], d["attempt_dir"],
                       d["reason"], d["cancel_reason"], d.get("worker_id"))


class RemoteBackend:
    """A backend made of API calls: what the CLI's commands need of one."""

    name = "api"
    remote = True

    def __init__(self, url: str, token: str) -> None:
        self.client = ApiClient(url, token)
        self._attempts: dict[str, tuple[str, int]] = {}

    async def open(self, *, create: bool = True) -> None:
        pass

    async def check_readiness(self) -> None:
        pass

    async def close(self) -> None:
        self.client.close()

    def publisher(self) -> "RemoteBackend":
        return self

    def reader(self) -> "RemoteBackend":
        return self

    def execution(self) -> "RemoteBackend":
        return self

    def run_control(self) -> "RemoteBackend":
        return self

    # ---------------------------------------------------------------- projects, tasks, triggers

    async def list_projects(self, limit: int | None = None) -> Sequence[ProjectRecord]:
        return [_project(p) for p in self.client.call("GET", "/projects")][:limit]

    async def create_project(self, project_id: str, name: str | None = None) -> ProjectRecord:
        return _project(self.client.call("POST", "/projects", {"project_id": project_id, "name": name}
                                         if name is not None else {"project_id": project_id}))

    async def project_state(self, project_id: str) -> Any:
        from qinglong.contracts.apply import ProjectState

        try:
            tasks = self.client.call("GET", f"/projects/{_q(project_id)}/tasks")
        except NotFound:
            return ProjectState(project_id, False)
        return ProjectState(project_id, True, project_id, {
            t["task_id"]: TaskRecord(t["project_id"], t["task_id"], t["task_revision"],
                                     {"command": t["command"]} if t["command"] is not None else {},
                                     t["content_digest"]) for t in tasks})

    async def task_head(self, project_id: str, task_id: str) -> TaskRecord:
        t = self.client.call("GET", f"/projects/{_q(project_id)}/tasks/{_q(task_id)}")
        return TaskRecord(t["project_id"], t["task_id"], t["task_revision"], t["payload"], t["content_digest"])

    async def put_task(self, project_id: str, task_id: str, payload: Mapping[str, Any]) -> TaskRecord:
        t = self.client.call("PUT", f"/projects/{_q(project_id)}/tasks/{_q(task_id)}", {"payload": dict(payload)})
        return TaskRecord(t["project_id"], t["task_id"], t["task_revision"], payload, t["content_digest"])

    async def delete_task(self, project_id: str, task_id: str) -> None:
        self.client.call("DELETE", f"/projects/{_q(project_id)}/tasks/{_q(task_id)}")

    async def list_triggers(self, project_id: str | None = None, limit: int | None = None,
                            kind: str | None = None) -> Sequence[TriggerHead]:
        if project_id is None:
            heads = [h for p in await self.list_projects()
                     for h in self.client.call("GET", f"/projects/{_q(p.project_id)}/triggers")]
        else:
            heads = self.client.call("GET", f"/projects/{_q(project_id)}/triggers")
        return [_trigger(h) for h in heads if kind is None or h["kind"] == kind][:limit]

    async def put_trigger(self, definition: Any) -> TriggerHead:
        return _trigger(self.client.call(
            "PUT", f"/projects/{_q(definition.project_id)}/triggers/{_q(definition.trigger_id)}",
            {"task_id": definition.task_id, "kind": definition.kind, "spec": dict(definition.spec),
             "misfire_policy": definition.misfire_policy.value, "misfire_grace_ms": definition.misfire_grace_ms,
             "enabled": definition.enabled, "jitter_ms": definition.jitter_ms}))

    async def set_trigger_enabled(self, project_id: str, trigger_id: str, enabled: bool) -> TriggerHead:
        return _trigger(self.client.call(
            "POST", f"/projects/{_q(project_id)}/triggers/{_q(trigger_id)}/{'enable' if enabled else 'disable'}"))

    async def delete_trigger(self, project_id: str, trigger_id: str) -> None:
        self.client.call("DELETE", f"/projects/{_q(project_id)}/triggers/{_q(trigger_id)}")

    async def store_stats(self) -> Any:
        import dataclasses

        from qinglong.contracts.observe import StoreStats

        stats = self.client.call("GET", "/status")["stats"]
        if stats is None:
            raise StoreUnavailable("the API's store gave no figures")
        return StoreStats(**{f.name: stats[f.name] for f in dataclasses.fields(StoreStats) if f.name in stats})

    # ---------------------------------------------------------------- runs

    async def admit_manual_run(self, project_id: str, task_id: str, key: str, now_ms: int) -> tuple[str, bool]:
        made = self.client.call("POST", f"/projects/{_q(project_id)}/tasks/{_q(task_id)}/runs",
                                headers={"Idempotency-Key": key})
        return made["run_id"], made["created"]

    async def list_runs(self, *, state: Any = None, project_id: str | None = None, task_id: str | None = None,
                        trigger_id: str | None = None, limit: int = 50) -> Sequence[RunSummary]:
        page = self.client.call("GET", "/runs", query={"state": getattr(state, "value", state),
                                                        "project": project_id, "task": task_id,
                                                        "limit": min(limit, 1000)})
        runs = [_summary(r) for r in page["runs"]]
        return [r for r in runs if trigger_id is None or r.trigger_id == trigger_id]

    async def run_detail(self, run_id: str) -> RunDetail:
        d = self.client.call("GET", f"/runs/{_q(run_id)}")
        attempts = tuple(_attempt(a) for a in d["attempts"])
        for a in attempts:
            self._attempts[a.attempt_id] = (run_id, a.attempt_no)
        return RunDetail(_summary(d), d["idempotency_key"], d["task_revision"], attempts)

    async def request_cancel(self, run_id: str, reason: Any = None, now_ms: int | None = None,
                             actor: Any = None) -> RunState:
        return RunState(self.client.call("POST", f"/runs/{_q(run_id)}/cancel")["state"])

    async def log_state(self, attempt_id: str) -> StoredLogState:
        run_id, number = self._attempts[attempt_id]
        detail = await self.run_detail(run_id)
        attempt = next(a for a in detail.attempts if a.attempt_no == number)
        _, response = self.client.call("GET", f"/runs/{_q(run_id)}/log", query={"attempt": number, "length": 1},
                                       raw=True)
        return StoredLogState(attempt_id, attempt.state, int(response.getheader("X-Log-Size") or 0),
                              attempt.log_dropped_bytes, attempt.log_deleted)

    async def read_log(self, attempt_id: str, offset: int, size: int) -> bytes:
        run_id, number = self._attempts[attempt_id]
        data, _ = self.client.call("GET", f"/runs/{_q(run_id)}/log",
                                   query={"attempt": number, "offset": offset, "length": size}, raw=True)
        return data


class RemoteContainer:
    """The local container (settings, providers, diagnostics) with the API as its backend."""

    def __init__(self, local: Any, url: str, token: str) -> None:
        self._local = local
        self._backend = RemoteBackend(url, token)

    def backend(self) -> RemoteBackend:
        return self._backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._local, name)
