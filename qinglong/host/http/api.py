"""The management API at ``/api/v1``: what operators do with the CLI, over HTTP, in the CLI's
``--json`` shapes (:mod:`qinglong.host.views`), with the errors of
:data:`qinglong.contracts.errors.HTTP_STATUSES`.

Every route is declared in :meth:`ApiService.routes` with the scope each method needs; a token
limited to projects sees nothing of the others (404, worded as for a project that does not exist).
Every changing request is audited: its entry rides in :data:`CURRENT_AUDIT` into the store's write
transaction, and where a store writes it elsewhere (a cluster's run control, whose role cannot
write the log) it is recorded right after the change and before the answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Callable, Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from qinglong.contracts.capabilities import ExecutingBackend, RemoteExecutionBackend
from qinglong.contracts.cli import whole_number
from qinglong.contracts.errors import (
    AlreadyExists,
    NotFound,
    QinglongError,
    UserError,
    project_not_found,
)
from qinglong.contracts.records import DEFAULT_MISFIRE_GRACE_MS, MisfirePolicy, TriggerDefinition
from qinglong.contracts.store import (MAX_JSON_DEPTH, MAX_PAYLOAD_BYTES, check_identifier, check_json_value,
                                     check_project_name, check_task_payload)
from qinglong.contracts.tokens import CURRENT_AUDIT, AuditEntry, AuditScope

from .. import views
from .app import SIGNED, Method, RouteSpec, error_response
from .auth import Principal

PREFIX = "/api/v1"
#: Runs a listing returns at most, and how deep a cursor may page.
MAX_LIMIT = 1000
MAX_DEPTH = 10_000
FOLLOW_POLL_S = 0.2
#: Hook signatures remembered against replays under another delivery id (a few MB at most).
MAX_HOOK_SIGNATURES = 20_000

JSON_OBJECT = {"type": "object"}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class BodyError(UserError):
    """A request body that is not the JSON object expected."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _depth(text: str) -> int:
    """The deepest nesting of brackets outside strings (checked before parsing, so a deeply
    nested body is refused without recursing into it)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError("the request body is not UTF-8") from None
    if _depth(text) > MAX_JSON_DEPTH:
        raise BodyError(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise BodyError(f"the request body is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(value, dict):
        raise BodyError("the request body must be a JSON object")
    return value


def _known_keys(body: Mapping[str, Any], *known: str) -> None:
    """Refuse a key the route does not take: a misspelt one ignored would do the opposite of what
    was asked (a token of every project, a trigger left enabled)."""
    for key in body:
        if key not in known:
            raise BodyError(f"the body has an unknown key {key!r}; expected {', '.join(known)}", key)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are each given once: another parser would read the first of two."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise BodyError(f"the request body gives the key {key!r} twice", key)
        value[key] = item
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = True,
           default: Any = None) -> Any:
    if name not in body:
        if required:
            raise BodyError(f"the body needs {name!r}", name)
        return default
    value = body[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BodyError(f"{name!r} has the wrong type", name)
    return value


def _int_query(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    text = request.query_params.get(name)
    if text is None:
        return default
    value = whole_number(text)
    if value is None or not low <= value <= high:
        raise BodyError(f"query parameter {name!r}: expected an integer from {low} to {high}", name)
    return value


class ApiService:
    """The API's routes over one opened backend."""

    def __init__(self, backend: Any, *, profile: str, execution_limits: Any, providers: Mapping[str, Any],
                 grace_ms: int, clock_ms: Callable[[], int] = _now_ms) -> None:
        from ..tokens import token_store_of

        self.backend = backend
        self.profile = profile
        self.limits = execution_limits
        self.providers = providers
        self.grace_ms = grace_ms
        self.clock_ms = clock_ms
        self.tokens = token_store_of(backend)
        #: per trigger: the minute (unix minutes) and the deliveries accepted in it
        self._hook_counts: dict[str, tuple[int, int]] = {}
        #: per trigger and signature accepted: its delivery id and when its timestamp leaves the
        #: window (the delivery id is not signed: a signature opens one delivery, not any)
        self._hook_signatures: dict[tuple[str, str], tuple[str, int]] = {}
        #: Called after a Run was admitted or a cancel requested here (the local dispatcher's
        #: wake-up: it starts or signals at once instead of at its next poll). Must not raise.
        self.on_runs_changed: Callable[[], None] = lambda: None

    async def lookup_token(self, digest: str) -> Any:
        return await self.tokens.token_by_digest(digest)

    # ------------------------------------------------------------------ helpers

    def _see(self, principal: Principal, project_id: str) -> None:
        """Refuse a project the token does not cover exactly as one that does not exist."""
        check_identifier("project_id", project_id)
        if not principal.sees(project_id):
            raise project_not_found(project_id)

    def _all_projects(self, principal: Principal) -> None:
        if principal.projects is not None:
            raise _Forbidden("a token limited to projects cannot do this")

    async def _audited(self, principal: Principal, request: Request, action: str, obj: str,
                       change: Callable[[], Any], detail: Mapping[str, Any] | None = None) -> Any:
        entry = AuditEntry(self.clock_ms(), principal.name, principal.token_id, principal.source, action, obj,
                           "ok", dict(detail or {}))
        scope = AuditScope(entry)
        token = CURRENT_AUDIT.set(scope)
        try:
            result = await change()
        except QinglongError as exc:
            CURRENT_AUDIT.reset(token)
            if not isinstance(exc, (NotFound,)):  # an unknown object: nothing to attribute
                await self.tokens.record_audit(AuditEntry(entry.at_ms, entry.actor, entry.token_id, entry.source,
                                                          action, obj, "refused", {"error": type(exc).__name__}))
            raise
        except BaseException:
            CURRENT_AUDIT.reset(token)
            raise
        CURRENT_AUDIT.reset(token)
        if not scope.written:
            await self.tokens.record_audit(entry)
        return result

    def _execution(self) -> Any:
        return self.backend.execution() if isinstance(self.backend, ExecutingBackend) else None

    def _runs(self) -> Any:
        store = self._execution()
        if store is not None:
            return store
        if isinstance(self.backend, RemoteExecutionBackend):
            control = self.backend.run_control()
            if control is not None:
                return control
        raise UserError(f"the {self.profile} profile's store does not record how Runs ran")

    async def _run_detail(self, principal: Principal, run_id: str) -> Any:
        check_identifier("run_id", run_id)
        try:
            detail = await self._runs().run_detail(run_id)
        except NotFound:
            detail = None
        if detail is None or not principal.sees(detail.run.project_id):
            raise NotFound(f"run {run_id} does not exist")
        return detail

    # ------------------------------------------------------------------ projects

    async def list_projects(self, request: Request, principal: Principal) -> Response:
        projects = await self.backend.reader().list_projects()
        return JSONResponse([views.project_json(p) for p in projects if principal.sees(p.project_id)])

    async def create_project(self, request: Request, principal: Principal) -> Response:
        self._all_projects(principal)
        body = await json_body(request)
        _known_keys(body, "project_id", "name")
        project_id = _field(body, "project_id", str)
        name = _field(body, "name", str, required=False)
        check_identifier("project_id", project_id)
        if name is not None:
            check_project_name(name)
        project = await self._audited(principal, request, "project.create", project_id,
                                      lambda: self.backend.publisher().create_project(project_id, name))
        return JSONResponse(views.project_json(project), status_code=201)

    async def show_project(self, request: Request, principal: Principal) -> Response:
        project_id = request.path_params["project"]
        self._see(principal, project_id)
        for p in await self.backend.reader().list_projects():
            if p.project_id == project_id:
                return JSONResponse(views.project_json(p))
        raise project_not_found(project_id)

    async def delete_project(self, request: Request, principal: Principal) -> Response:
        project_id = request.path_params["project"]
        self._see(principal, project_id)

        async def change() -> Any:
            plan = await self.backend.publisher().delete_project(project_id)
            if not plan.changes:
                raise project_not_found(project_id)
            return plan

        plan = await self._audited(principal, request, "project.delete", project_id, change)
        return JSONResponse({"project_id": project_id, "dry_run": False,
                             "deleted": [c.to_json() for c in plan.changes]})

    # ------------------------------------------------------------------ tasks

    async def list_tasks(self, request: Request, principal: Principal) -> Response:
        project_id = request.path_params["project"]
        self._see(principal, project_id)
        state = await self.backend.publisher().project_state(project_id)
        if not state.exists:
            raise project_not_found(project_id)
        return JSONResponse([views.task_list_json(state.tasks[t]) for t in sorted(state.tasks)])

    async def show_task(self, request: Request, principal: Principal) -> Response:
        project_id, task_id = request.path_params["project"], request.path_params["task"]
        self._see(principal, project_id)
        check_identifier("task_id", task_id)
        task = await self.backend.reader().task_head(project_id, task_id)
        return JSONResponse(views.task_show_json(task, self.limits))

    async def put_task(self, request: Request, principal: Principal) -> Response:
        from qinglong.contracts.execution import (EXECUTION_KEYS, keep_env_values, parse_execution_spec,
                                                  spec_to_payload)

        project_id, task_id = request.path_params["project"], request.path_params["task"]
        self._see(principal, project_id)
        check_identifier("task_id", task_id)
        body = await json_body(request)
        _known_keys(body, "payload", "keep_env")
        payload = _field(body, "payload", dict)
        kept = _field(body, "keep_env", list, required=False, default=[])
        if kept:
            # env values are write-only: an editor keeps one by name, never by reading it back
            try:
                head = await self.backend.reader().task_head(project_id, task_id)
            except NotFound:
                head = None
            payload = keep_env_values(task_id, payload, kept, head.payload if head is not None else None)
        check_json_value("the task payload", payload, MAX_PAYLOAD_BYTES)
        # a kept value is the head's, still sealed: the publisher opens it for this variable only
        spec = parse_execution_spec(task_id, payload, self.limits, allow_sealed=True)
        stated = {key: value for key, value in payload.items() if key not in EXECUTION_KEYS}
        stated.update(spec_to_payload(spec))
        check_json_value("the task payload", stated, MAX_PAYLOAD_BYTES)
        check_task_payload(task_id, stated)  # the publisher's own refusals, before any audit entry
        task = await self._audited(principal, request, "task.put", f"{project_id}/{task_id}",
                                   lambda: self.backend.publisher().put_task(project_id, task_id, stated))
        return JSONResponse({"project_id": task.project_id, "task_id": task.task_id,
                             "task_revision": task.task_revision, "content_digest": task.content_digest})

    async def delete_task(self, request: Request, principal: Principal) -> Response:
        project_id, task_id = request.path_params["project"], request.path_params["task"]
        self._see(principal, project_id)
        check_identifier("task_id", task_id)
        await self._audited(principal, request, "task.delete", f"{project_id}/{task_id}",
                            lambda: self.backend.publisher().delete_task(project_id, task_id))
        return JSONResponse({"project_id": project_id, "task_id": task_id, "deleted": True})

    async def run_task(self, request: Request, principal: Principal) -> Response:
        project_id, task_id = request.path_params["project"], request.path_params["task"]
        self._see(principal, project_id)
        check_identifier("task_id", task_id)
        keys = request.headers.getlist("idempotency-key")
        if len(keys) > 1:
            raise BodyError("one Idempotency-Key header, not several", "Idempotency-Key")
        import uuid

        from qinglong.contracts.execution import check_manual_key

        key = keys[0] if keys else str(uuid.uuid4())
        try:
            check_manual_key("Idempotency-Key", key)
        except UserError as exc:
            raise BodyError(str(exc), "Idempotency-Key") from None
        store = self._execution()
        if store is None:
            raise UserError(f"`task run` needs a profile that runs Runs locally (edge or standalone); the "
                            f"{self.profile} profile's store does not execute them here")
        run_id, created = await self._audited(
            principal, request, "task.run", f"{project_id}/{task_id}",
            lambda: store.admit_manual_run(project_id, task_id, key, self.clock_ms()), {"idempotency_key": key})
        if created:
            self.on_runs_changed()
        return JSONResponse(views.manual_run_json(run_id, created, key), status_code=201 if created else 200)

    # ------------------------------------------------------------------ triggers

    async def list_triggers(self, request: Request, principal: Principal) -> Response:
        project_id = request.path_params["project"]
        self._see(principal, project_id)
        heads = await self.backend.reader().list_triggers(project_id)
        return JSONResponse([views.trigger_json(t) for t in heads])

    async def _trigger(self, project_id: str, trigger_id: str) -> Any:
        check_identifier("trigger_id", trigger_id)
        for head in await self.backend.reader().list_triggers(project_id):
            if head.trigger_id == trigger_id:
                return head
        raise NotFound(f"trigger {trigger_id} does not exist in project {project_id}")

    async def show_trigger(self, request: Request, principal: Principal) -> Response:
        project_id = request.path_params["project"]
        self._see(principal, project_id)
        return JSONResponse(views.trigger_json(await self._trigger(project_id, request.path_params["trigger"])))

    async def put_trigger(self, request: Request, principal: Principal) -> Response:
        """Add a trigger or publish a new revision: ``task_id``, ``kind``, ``spec``, optional
        ``misfire_policy``, ``misfire_grace_ms``, ``enabled``, ``jitter_ms`` (an update keeps what it
        leaves out)."""
        project_id, trigger_id = request.path_params["project"], request.path_params["trigger"]
        self._see(principal, project_id)
        check_identifier("trigger_id", trigger_id)
        body = await json_body(request)
        _known_keys(body, "task_id", "kind", "spec", "misfire_policy", "misfire_grace_ms", "enabled", "jitter_ms")
        current = None
        for head in await self.backend.reader().list_triggers(project_id):
            if head.trigger_id == trigger_id:
                current = head
        task_id = _field(body, "task_id", str, required=current is None, default=current and current.task_id)
        kind = _field(body, "kind", str, required=current is None, default=current and current.kind)
        spec = _field(body, "spec", dict, required=current is None, default=current and dict(current.spec))
        check_json_value("the trigger spec", spec, 4096)
        policy = _field(body, "misfire_policy", str, required=False,
                        default=current.misfire_policy.value if current else MisfirePolicy.FIRE_ONCE.value)
        try:
            misfire = MisfirePolicy(policy)
        except ValueError:
            raise BodyError(f"misfire_policy: expected one of {', '.join(m.value for m in MisfirePolicy)}",
                            "misfire_policy") from None
        grace = _field(body, "misfire_grace_ms", int, required=False,
                       default=current.misfire_grace_ms if current else DEFAULT_MISFIRE_GRACE_MS)
        enabled = _field(body, "enabled", bool, required=False, default=current.enabled if current else True)
        jitter = _field(body, "jitter_ms", int, required=False, default=current.jitter_ms if current else 0)
        definition = TriggerDefinition(project_id=project_id, trigger_id=trigger_id, task_id=task_id, kind=kind,
                                       spec=spec, misfire_policy=misfire, misfire_grace_ms=grace, enabled=enabled,
                                       jitter_ms=jitter)
        try:
            head = await self._audited(principal, request, "trigger.put", f"{project_id}/{trigger_id}",
                                       lambda: self.backend.publisher().put_trigger(definition))
        except AlreadyExists as exc:
            owner = getattr(exc, "owner_project_id", None)
            if owner is not None and not principal.sees(owner):  # never name a project it cannot see
                raise AlreadyExists(f"trigger id {trigger_id!r} is used by another project; trigger ids "
                                    "are unique across projects") from None
            raise
        return JSONResponse(views.trigger_json(head), status_code=200 if current else 201)

    async def _set_enabled(self, request: Request, principal: Principal, enabled: bool) -> Response:
        project_id, trigger_id = request.path_params["project"], request.path_params["trigger"]
        self._see(principal, project_id)
        check_identifier("trigger_id", trigger_id)
        head = await self._audited(principal, request, "trigger.enable" if enabled else "trigger.disable",
                                   f"{project_id}/{trigger_id}",
                                   lambda: self.backend.publisher().set_trigger_enabled(project_id, trigger_id, enabled))
        return JSONResponse(views.trigger_json(head))

    async def enable_trigger(self, request: Request, principal: Principal) -> Response:
        return await self._set_enabled(request, principal, True)

    async def disable_trigger(self, request: Request, principal: Principal) -> Response:
        return await self._set_enabled(request, principal, False)

    async def delete_trigger(self, request: Request, principal: Principal) -> Response:
        project_id, trigger_id = request.path_params["project"], request.path_params["trigger"]
        self._see(principal, project_id)
        check_identifier("trigger_id", trigger_id)
        await self._audited(principal, request, "trigger.delete", f"{project_id}/{trigger_id}",
                            lambda: self.backend.publisher().delete_trigger(project_id, trigger_id))
        return JSONResponse({"project_id": project_id, "trigger_id": trigger_id, "deleted": True})

    def _fire_times(self, kind: str, spec: Mapping[str, Any], after_ms: int, count: int,
                    jitter: tuple[str, str, int] | None = None) -> list[dict[str, Any]]:
        """Fire times as the scheduler starts them: a trigger's own jitter (project, trigger,
        window) moves each, as it moves its Runs."""
        from qinglong.contracts.jitter import JitteredSchedule
        from qinglong.contracts.providers import fire_times

        from ..cli.output import iso

        provider = self.providers.get(kind)
        if provider is None:
            raise UserError(f"unknown trigger kind {kind!r}")
        checked = provider.validate(spec)
        schedule: Any = provider if not jitter or not jitter[2] else JitteredSchedule(provider, *jitter)
        return views.fire_times_json(fire_times(schedule, checked, after_ms, count), iso)

    async def trigger_next(self, request: Request, principal: Principal) -> Response:
        project_id = request.path_params["project"]
        self._see(principal, project_id)
        head = await self._trigger(project_id, request.path_params["trigger"])
        count = _int_query(request, "count", 5, 1, 100)
        after = _int_query(request, "after_ms", self.clock_ms(), 0, 253_402_300_799_000)
        return JSONResponse({"trigger": views.trigger_json(head),
                             "next": self._fire_times(head.kind, head.spec, after, count,
                                                      (project_id, head.trigger_id, head.jitter_ms))})

    async def kind_next(self, request: Request, principal: Principal) -> Response:
        """Fire times of a spec of any trigger kind, as its provider computes them: the host
        names no kind's keys, the provider validates the spec it is given."""
        kind = request.path_params["kind"]
        text = request.query_params.get("spec")
        if not text:
            raise BodyError("query parameter 'spec' (the trigger spec as a JSON object) is required", "spec")
        try:
            spec = json.loads(text)
        except ValueError:
            raise BodyError("query parameter 'spec' is not JSON", "spec") from None
        if not isinstance(spec, dict):
            raise BodyError("query parameter 'spec' must be a JSON object", "spec")
        count = _int_query(request, "count", 5, 1, 100)
        after = _int_query(request, "after_ms", self.clock_ms(), 0, 253_402_300_799_000)
        from qinglong.contracts.hooks import masked_spec

        return JSONResponse({"kind": kind, "spec": masked_spec(spec),
                             "next": self._fire_times(kind, spec, after, count)})

    # ------------------------------------------------------------------ runs

    async def list_runs(self, request: Request, principal: Principal) -> Response:
        from qinglong.contracts.execution import RunState

        query = request.query_params
        project = query.get("project")
        if project is not None:
            self._see(principal, project)
        elif principal.projects is not None:
            if len(principal.projects) != 1:
                raise BodyError("a token limited to several projects must name one: ?project=P", "project")
            (project,) = principal.projects
        state = query.get("state")
        try:
            state_value = RunState(state) if state else None
        except ValueError:
            raise BodyError(f"state: expected one of {', '.join(s.value for s in RunState)}", "state") from None
        task = query.get("task")
        if task is not None:
            check_identifier("task_id", task)
        limit = _int_query(request, "limit", 50, 1, MAX_LIMIT)
        cursor = query.get("cursor")
        skip = 0
        if cursor is not None:
            depth = whole_number(cursor)
            if depth is None or depth > MAX_DEPTH:
                raise BodyError("cursor: expected the 'next' value of a previous page", "cursor")
            skip = depth
        since = _int_query(request, "since_ms", None, 0, 253_402_300_799_000)
        until = _int_query(request, "until_ms", None, 0, 253_402_300_799_000)
        if since is None and until is None:
            runs = list(await self._runs().list_runs(state=state_value, project_id=project, task_id=task,
                                                     limit=skip + limit + 1))
        else:
            # newest first by scheduled time: a window is a slice of the newest MAX_DEPTH Runs
            runs = [r for r in await self._runs().list_runs(state=state_value, project_id=project, task_id=task,
                                                            limit=MAX_DEPTH + MAX_LIMIT + 1)
                    if (since is None or r.scheduled_for_ms >= since)
                    and (until is None or r.scheduled_for_ms < until)]
        page = runs[skip:skip + limit]
        more = len(runs) > skip + limit and skip + limit <= MAX_DEPTH
        return JSONResponse({"runs": [views.run_summary_json(r) for r in page],
                             "next": str(skip + limit) if more else None})

    async def show_run(self, request: Request, principal: Principal) -> Response:
        detail = await self._run_detail(principal, request.path_params["run"])
        return JSONResponse(views.run_detail_json(detail))

    async def cancel_run(self, request: Request, principal: Principal) -> Response:
        from qinglong.contracts.execution import Actor, CancelReason

        run_id = request.path_params["run"]
        detail = await self._run_detail(principal, run_id)
        before = detail.run.state
        store = self._execution()

        async def change() -> Any:
            if store is None:
                return await self._runs().request_cancel(run_id, CancelReason.OPERATOR)
            return await store.request_cancel(run_id, CancelReason.OPERATOR, self.clock_ms(), Actor.OPERATOR)

        after = await self._audited(principal, request, "run.cancel", run_id, change)
        if store is not None:
            self.on_runs_changed()
        return JSONResponse(views.cancel_json(run_id, before, after))

    async def run_log(self, request: Request, principal: Principal) -> Response:
        """An Attempt's log: a byte range (``offset``, ``length``), or with ``follow=1`` a stream of
        Server-Sent Events (``log`` events, then one ``end`` event once the Attempt ended)."""
        run_id = request.path_params["run"]
        await self._run_detail(principal, run_id)
        attempt = _int_query(request, "attempt", None, 1, 1_000_000)
        offset = _int_query(request, "offset", 0, 0, 2**40) or 0
        length = _int_query(request, "length", 1 << 20, 1, 16 << 20)
        follow = request.query_params.get("follow") in ("1", "true")
        if not follow:
            sink = _Sink()
            await self._copy_log(run_id, attempt, False, sink)
            data = b"".join(sink.chunks)
            return Response(data[offset:offset + length], media_type="application/octet-stream",
                            headers={"X-Log-Size": str(len(data))})
        return StreamingResponse(self._follow(run_id, attempt, offset), media_type="text/event-stream")

    async def _copy_log(self, run_id: str, attempt: int | None, follow: bool, out: Any) -> None:
        from ..cli import runs as cli_runs

        store = self._execution()
        if store is None:
            await cli_runs._print_stored_log(self._runs(), run_id, attempt, None, follow, out)
        else:
            await cli_runs._print_log(store, run_id, attempt, None, follow, out)

    async def _follow(self, run_id: str, attempt: int | None, offset: int) -> AsyncIterator[bytes]:
        sink = _Sink()
        task = asyncio.create_task(self._copy_log(run_id, attempt, True, sink))
        sent = 0
        try:
            while True:
                done = task.done()
                data = b"".join(sink.chunks)
                if len(data) > sent:
                    start = max(sent, offset)
                    if start < len(data):
                        text = data[start:].decode("utf-8", "replace")
                        yield ("event: log\n" + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n").encode()
                    sent = len(data)
                if done:
                    error = task.exception()
                    if error is not None:
                        yield f"event: error\ndata: {type(error).__name__}\n\n".encode()
                    yield b"event: end\ndata: the attempt ended\n\n"
                    return
                await asyncio.sleep(FOLLOW_POLL_S)
        finally:
            if not task.done():
                task.cancel()

    # ------------------------------------------------------------------ status, tokens, audit

    async def status(self, request: Request, principal: Principal) -> Response:
        from qinglong.contracts.observe import status_verdict

        from ..cli.status import take_readings

        not_ready, before, now = await take_readings(self.backend, once=True, interval_s=0)
        finding = status_verdict(before, now, grace_ms=self.grace_ms,
                                 expect_workers=now.worker_free_slots is not None) if now is not None else None
        code = int(finding.verdict) if finding is not None else 4
        return JSONResponse(views.status_json(self.profile, not_ready, finding, code, self.grace_ms, None,
                                              now, before))

    async def skips(self, request: Request, principal: Principal) -> Response:
        """Recorded misfires and Runs skipped before they started (``skips --json``), newest first,
        of the projects the token sees."""
        limit = _int_query(request, "limit", 50, 1, MAX_LIMIT)
        store = self._execution()
        run_skips = await store.recent_run_skips(limit) if store is not None else []
        skips = await self.backend.reader().recent_skips(limit)
        return JSONResponse({"skips": [views.skip_json(s) for s in skips if principal.sees(s.project_id)],
                             "run_skips": [views.run_skip_json(s) for s in run_skips if principal.sees(s.project_id)]})

    async def workers(self, request: Request, principal: Principal) -> Response:
        """The workers' sessions (the cluster); a profile that runs its Runs in this process has none.

        A token limited to projects sees a worker registered for at least one of them (a worker
        registered for every project included), and of its projects only those; a session with
        no registration (made without the gateway) only a token of every project sees."""
        from qinglong.contracts.execution import ListsWorkers

        limit = _int_query(request, "limit", 200, 1, MAX_LIMIT)
        control = self.backend.run_control() if isinstance(self.backend, RemoteExecutionBackend) else None
        if not isinstance(control, ListsWorkers):
            return JSONResponse({"workers": None, "reason": f"the {self.profile} profile runs its Runs in this "
                                 "process: it has no workers"})
        registered = await self._registered_projects()
        visible: list[str] | None = None
        if principal.projects is not None:
            visible = sorted(w for w, projects in registered.items()
                             if not projects or principal.projects & set(projects))
        listed = await control.list_workers(self.clock_ms(), limit, worker_ids=visible)
        return JSONResponse({"workers": [views.worker_json(w, self._shown_projects(registered, w.worker_id, principal))
                                         for w in listed], "reason": None})

    async def _registered_projects(self) -> dict[str, tuple[str, ...]]:
        """Each registered worker id's projects (empty: every project), revoked ones too (their
        closed sessions stay listed); nothing where the store registers no workers."""
        from qinglong.contracts.worker import WorkerRegistry

        found = getattr(self.backend, "worker_registry", None)
        registry = found() if found is not None else None
        if not isinstance(registry, WorkerRegistry):
            return {}
        return {r.worker_id: tuple(r.projects) for r in await registry.list_workers()}

    @staticmethod
    def _shown_projects(registered: Mapping[str, tuple[str, ...]], worker_id: str,
                        principal: Principal) -> list[str] | None:
        """The worker's projects as the token may see them: all of them (None: every project) for
        a token of every project, else only the token's own."""
        projects = registered.get(worker_id)
        if principal.projects is None:
            return sorted(projects) if projects else None
        if projects is None:
            return []  # not listed for such a token; never anything of another project
        return sorted(principal.projects & set(projects)) if projects else sorted(principal.projects)

    async def list_tokens(self, request: Request, principal: Principal) -> Response:
        at = self.clock_ms()
        return JSONResponse([t.as_json(at) for t in await self.tokens.list_tokens()])

    async def create_token(self, request: Request, principal: Principal) -> Response:
        from ..tokens import create_token

        body = await json_body(request)
        _known_keys(body, "name", "scope", "projects", "expires_in_ms")
        name = _field(body, "name", str)
        scope = _field(body, "scope", str)
        projects = _field(body, "projects", list, required=False, default=[])
        if not all(isinstance(p, str) for p in projects):
            raise BodyError("'projects' must be a list of project ids", "projects")
        expires = _field(body, "expires_in_ms", int, required=False)
        record, secret = await create_token(self.tokens, name, scope, projects, expires, actor=principal.name,
                                            actor_id=principal.token_id, source=principal.source)
        return JSONResponse(dict(record.as_json(self.clock_ms()), secret=secret), status_code=201)

    async def revoke_token(self, request: Request, principal: Principal) -> Response:
        from ..tokens import revoke_token

        record = await revoke_token(self.tokens, request.path_params["name"], actor=principal.name,
                                    actor_id=principal.token_id, source=principal.source)
        return JSONResponse({"name": record.name, "revoked": True})

    async def list_notifications(self, request: Request, principal: Principal) -> Response:
        """Deliveries of the events out, newest first: ``qinglong notifications`` over HTTP."""
        from qinglong.contracts.capabilities import EventingBackend
        from qinglong.contracts.events import DeliveryState

        from ..cli.events import delivery_json

        if principal.projects is not None:
            # deliveries span every project and the operator's own events
            raise _Forbidden("deliveries span every project: a token limited to projects cannot "
                             "read them")
        outbox = self.backend.outbox() if isinstance(self.backend, EventingBackend) else None
        if outbox is None:
            raise UserError(f"the {self.profile} profile's store keeps no events out")
        state = request.query_params.get("state")
        try:
            state_value = DeliveryState(state) if state else None
        except ValueError:
            raise BodyError("state: expected one of "
                            f"{', '.join(s.value for s in DeliveryState)}", "state") from None
        limit = _int_query(request, "limit", 50, 1, MAX_LIMIT)
        cursor = request.query_params.get("cursor")
        skip = 0
        if cursor is not None:
            depth = whole_number(cursor)
            if depth is None or depth > MAX_DEPTH:
                raise BodyError("cursor: expected the 'next' value of a previous page", "cursor")
            skip = depth
        found = list(await outbox.list_deliveries(state=state_value, limit=skip + limit + 1))
        page = found[skip:skip + limit]
        more = len(found) > skip + limit and skip + limit <= MAX_DEPTH
        return JSONResponse({"deliveries": [delivery_json(d) for d in page],
                             "next": str(skip + limit) if more else None})

    async def audit(self, request: Request, principal: Principal) -> Response:
        since = _int_query(request, "since_ms", None, 0, 2**62)
        limit = _int_query(request, "limit", 100, 1, MAX_LIMIT)
        return JSONResponse([e.as_json() for e in await self.tokens.list_audit(since, limit)])

    async def openapi(self, request: Request, principal: Principal) -> Response:
        from qinglong import __version__

        from .openapi import document

        return JSONResponse(document(request.app.state.specs, __version__))

    # ------------------------------------------------------------------ incoming webhooks

    async def receive_hook(self, request: Request, principal: Principal | None) -> Response:
        """A delivery to a ``hook`` trigger: signed with the trigger's secret, not a token.

        Every refusal before the signature is verified says the same (no such hook) whether the
        project, the trigger or its kind is wrong, so the route tells nothing to who lacks the
        secret; nothing is written before the signature, the timestamp and the rate pass."""
        from qinglong.contracts.capabilities import AdmitsOccurrences
        from qinglong.contracts.event_sources import MAX_EVENT_ID_CHARS
        from qinglong.contracts.hooks import DELIVERY_HEADER, HOOK_KIND, MAX_HOOK_BODY_BYTES, hook_settings
        from qinglong.contracts.secrets import opened_trigger_spec
        from qinglong.contracts.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify

        project_id, trigger_id = request.path_params["project"], request.path_params["trigger"]
        if request.method != "POST":
            return error_response(405, "method_not_allowed", "a delivery is a POST", headers={"Allow": "POST"})
        unknown = error_response(404, "unknown", "no such hook")
        try:
            check_identifier("project_id", project_id)
            check_identifier("trigger_id", trigger_id)
            head = await self._trigger(project_id, trigger_id)
        except (NotFound, UserError):
            return unknown
        if head.kind != HOOK_KIND:
            return unknown
        body = await request.body()
        if len(body) > MAX_HOOK_BODY_BYTES:
            return error_response(413, "too_large", f"a delivery's body may hold at most {MAX_HOOK_BODY_BYTES} bytes")
        for name in (SIGNATURE_HEADER, TIMESTAMP_HEADER, DELIVERY_HEADER):
            # one layer reading the first and another the last would check one and log another
            if len(request.headers.getlist(name)) > 1:
                return error_response(400, "doubled_header", f"one {name} header, not several", name)
        # opened only here, to verify; a key that does not open it is a SecretsError (503)
        sealer = getattr(getattr(self.backend, "context", None), "sealer", None)
        spec = opened_trigger_spec(sealer, project_id, trigger_id, head.spec)
        secret, window_s, per_minute = hook_settings(spec)
        now_ms = self.clock_ms()
        timestamp = request.headers.get(TIMESTAMP_HEADER, "")
        signed = request.headers.get(SIGNATURE_HEADER, "")
        if not verify(secret, timestamp, body, signed, now_s=now_ms / 1000, tolerance_s=window_s):
            return error_response(401, "bad_signature", f"the signature or the timestamp is refused (signed "
                                  f"over '<{TIMESTAMP_HEADER}>.<body>', within {window_s}s)")
        delivery = request.headers.get(DELIVERY_HEADER, "")
        if not 0 < len(delivery) <= MAX_EVENT_ID_CHARS or not delivery.isprintable():
            return error_response(400, "bad_delivery", f"{DELIVERY_HEADER}: expected 1 to {MAX_EVENT_ID_CHARS} "
                                  "printable characters", DELIVERY_HEADER)
        if self._hook_replayed(trigger_id, signed, delivery, now_ms):
            return error_response(401, "replayed", "this signature was accepted for another delivery: "
                                  f"each delivery is signed with its own {TIMESTAMP_HEADER}")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return error_response(400, "bad_body", "a delivery's body must be UTF-8 text")
        minute = now_ms // 60_000
        seen_minute, count = self._hook_counts.get(trigger_id, (minute, 0))
        if seen_minute != minute:
            count = 0
        if count >= per_minute:
            return error_response(429, "rate_limited", f"this hook accepts {per_minute} deliveries a minute",
                                  headers={"Retry-After": str(60 - (now_ms // 1000) % 60)})
        self._hook_counts[trigger_id] = (minute, count + 1)
        self._hook_signatures[(trigger_id, signed)] = (delivery, (int(timestamp) + window_s) * 1000)
        if not isinstance(self.backend, AdmitsOccurrences) or self.backend.occurrences() is None:
            raise UserError(f"the {self.profile} profile's store does not admit event Runs")
        payload = {"body": text, "content_type": request.headers.get("content-type", ""), "delivery": delivery}
        result = await self.backend.occurrences().admit_occurrence(HOOK_KIND, trigger_id, delivery, payload, now_ms)
        if result.run_id is None:
            return error_response(409, "not_admitted", "this hook admits nothing now (the trigger is disabled, "
                                  "or its project or task is not active)")
        return JSONResponse({"run_id": result.run_id, "created": result.created, "delivery": delivery},
                            status_code=202 if result.created else 200)

    def _hook_replayed(self, trigger_id: str, signed: str, delivery: str, now_ms: int) -> bool:
        """The signature was accepted, within its window, for another delivery id. The oldest
        signatures are forgotten once their timestamp left the window (it refuses them now), and
        beyond :data:`MAX_HOOK_SIGNATURES`."""
        remembered = self._hook_signatures
        while remembered:
            oldest = next(iter(remembered))
            if remembered[oldest][1] >= now_ms and len(remembered) < MAX_HOOK_SIGNATURES:
                break
            del remembered[oldest]
        seen = remembered.get((trigger_id, signed))
        return seen is not None and seen[0] != delivery

    # ------------------------------------------------------------------ the route table

    def routes(self) -> list[RouteSpec]:
        p = PREFIX
        body = JSON_OBJECT
        return [
            RouteSpec(f"{p}/projects", {
                "GET": Method("read", self.list_projects, "list projects"),
                "POST": Method("write", self.create_project, "create a project", body=body)}, api=True),
            RouteSpec(p + "/projects/{project}", {
                "GET": Method("read", self.show_project, "show a project"),
                "DELETE": Method("write", self.delete_project, "delete a project (its Runs stay)")}, api=True),
            RouteSpec(p + "/projects/{project}/tasks", {
                "GET": Method("read", self.list_tasks, "list a project's tasks")}, api=True),
            RouteSpec(p + "/projects/{project}/tasks/{task}", {
                "GET": Method("read", self.show_task, "show a task (env values masked)"),
                "PUT": Method("write", self.put_task, "create a task or publish a new revision "
                              "(keep_env: env names whose values stay as they are)", body=body),
                "DELETE": Method("write", self.delete_task, "delete a task")}, api=True),
            RouteSpec(p + "/projects/{project}/tasks/{task}/runs", {
                "POST": Method("run", self.run_task, "admit a manual Run (Idempotency-Key header)")}, api=True),
            RouteSpec(p + "/projects/{project}/triggers", {
                "GET": Method("read", self.list_triggers, "list a project's triggers")}, api=True),
            RouteSpec(p + "/projects/{project}/triggers/{trigger}", {
                "GET": Method("read", self.show_trigger, "show a trigger"),
                "PUT": Method("write", self.put_trigger, "add a trigger or publish a new revision", body=body),
                "DELETE": Method("write", self.delete_trigger, "delete a trigger")}, api=True),
            RouteSpec(p + "/projects/{project}/triggers/{trigger}/enable", {
                "POST": Method("write", self.enable_trigger, "enable a trigger")}, api=True),
            RouteSpec(p + "/projects/{project}/triggers/{trigger}/disable", {
                "POST": Method("write", self.disable_trigger, "disable a trigger")}, api=True),
            RouteSpec(p + "/projects/{project}/triggers/{trigger}/next", {
                "GET": Method("read", self.trigger_next, "a trigger's next fire times",
                              query={"count": "how many (1-100, default 5)", "after_ms": "from this instant"})},
                      api=True),
            RouteSpec(f"{p}/runs", {
                "GET": Method("read", self.list_runs, "list Runs, newest first",
                              query={"state": "a Run state", "project": "a project", "task": "a task",
                                     "since_ms": "scheduled at or after (unix ms)",
                                     "until_ms": "scheduled before (unix ms)",
                                     "limit": "1-1000, default 50", "cursor": "the previous page's next"})},
                      api=True),
            RouteSpec(p + "/runs/{run}", {
                "GET": Method("read", self.show_run, "a Run and its Attempts")}, api=True),
            RouteSpec(p + "/runs/{run}/cancel", {
                "POST": Method("run", self.cancel_run, "cancel a Run")}, api=True),
            RouteSpec(p + "/runs/{run}/log", {
                "GET": Method("read", self.run_log, "an Attempt's log: a byte range, or follow as SSE",
                              query={"attempt": "the Attempt's number (default: the last)",
                                     "offset": "first byte", "length": "bytes at most",
                                     "follow": "1: Server-Sent Events until the Attempt ends"})}, api=True),
            RouteSpec(f"{p}/status", {
                "GET": Method("read", self.status, "the verdict and figures of qinglong status",
                              every_project=True)}, api=True),
            RouteSpec(p + "/kinds/{kind}/next", {
                "GET": Method("read", self.kind_next, "preview the fire times of a trigger spec of a kind",
                              query={"spec": "the trigger spec as a JSON object, as trigger add takes it",
                                     "count": "1-100", "after_ms": "from this instant"})}, api=True),
            RouteSpec(f"{p}/skips", {
                "GET": Method("read", self.skips, "recorded misfires and Runs skipped before they started",
                              query={"limit": "1-1000, default 50"})}, api=True),
            RouteSpec(f"{p}/workers", {
                "GET": Method("read", self.workers, "the workers' sessions: state, labels, capacity, free slots",
                              query={"limit": "1-1000, default 200"})}, api=True),
            RouteSpec(f"{p}/tokens", {
                "GET": Method("admin", self.list_tokens, "list tokens (never a secret)", every_project=True),
                "POST": Method("admin", self.create_token, "make a token (its secret is answered once)",
                               body=body, every_project=True)}, api=True),
            RouteSpec(p + "/tokens/{name}", {
                "DELETE": Method("admin", self.revoke_token, "revoke a token", every_project=True)}, api=True),
            RouteSpec(f"{p}/openapi.json", {
                "GET": Method("read", self.openapi, "this document")}, api=True),
            RouteSpec(p + "/hooks/{project}/{trigger}", {
                "POST": Method(SIGNED, self.receive_hook, "deliver to a hook trigger (signed, no token): "
                               "X-Qinglong-Timestamp, X-Qinglong-Signature, X-Qinglong-Delivery",
                               responses={202: "a Run admitted", 400: "a signature, timestamp or delivery "
                                          "header sent twice, or no delivery id",
                                          401: "bad signature or timestamp, or a signature replayed",
                                          404: "no such hook", 409: "the trigger admits nothing now",
                                          413: "body too large", 429: "rate limited"})}, api=True),
            RouteSpec(f"{p}/notifications", {
                "GET": Method("read", self.list_notifications,
                              "deliveries of the events out, newest first (a token limited to "
                              "projects is refused: they span every project)",
                              query={"state": "pending, delivered or dead",
                                     "limit": "1-1000, default 50", "cursor": "the previous page's next"})},
                      api=True),
            RouteSpec(f"{p}/audit", {
                "GET": Method("admin", self.audit, "the audit log, newest first",
                              query={"since_ms": "entries at or after", "limit": "1-1000"}, every_project=True)}, api=True),
        ]


class _Forbidden(UserError):
    """Refused by the token's limits (403)."""

    http_status = 403


class _Sink:
    """A binary file the CLI's log copier writes into."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass
