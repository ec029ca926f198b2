"""The JSON shapes of what operators read: one serialiser per record, used by the CLI's
``--json`` and by the management API alike, so both say the same thing the same way."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


def _value(enum_or_text: Any) -> Any:
    return getattr(enum_or_text, "value", enum_or_text)


def project_json(p: Any) -> dict[str, Any]:
    return {"project_id": p.project_id, "name": p.name, "active": p.active}


def trigger_json(t: Any) -> dict[str, Any]:
    from qinglong.contracts.hooks import masked_spec  # a secret in a spec is never shown

    return {"project_id": t.project_id, "trigger_id": t.trigger_id, "trigger_revision": t.trigger_revision,
            "task_id": t.task_id, "kind": t.kind, "spec": masked_spec(t.spec), "misfire_policy": t.misfire_policy.value,
            "misfire_grace_ms": t.misfire_grace_ms, "jitter_ms": t.jitter_ms, "enabled": t.enabled,
            "content_digest": t.content_digest}


def skip_json(s: Any) -> dict[str, Any]:
    """A recorded misfire (:class:`~qinglong.contracts.records.SkipView`) as ``skips --json`` prints it."""
    return {"project_id": s.project_id, "trigger_id": s.trigger_id, "trigger_revision": s.trigger_revision,
            "policy": s.policy.value, "first_skipped_ms": s.first_skipped_ms, "last_skipped_ms": s.last_skipped_ms,
            "count": s.count, "count_exact": s.count_exact, "recorded_at_ms": s.recorded_at_ms}


def run_skip_json(s: Any) -> dict[str, Any]:
    """A Run skipped before it started (``RunSkipView``) as ``skips --json`` prints it."""
    return {"kind": "run", "run_id": s.run_id, "project_id": s.project_id, "task_id": s.task_id,
            "trigger_id": s.trigger_id, "scheduled_for_ms": s.scheduled_for_ms, "reason": s.reason,
            "recorded_at_ms": s.recorded_at_ms}


def worker_json(w: Any, projects: list[str] | None = None) -> dict[str, Any]:
    """A :class:`~qinglong.contracts.execution.WorkerView` and the projects it is registered for
    (None: every project)."""
    return {"worker_id": w.worker_id, "state": w.state, "labels": list(w.labels), "projects": projects,
            "capacity": w.capacity,
            "running": w.running, "free_slots": w.free_slots, "opened_at_ms": w.opened_at_ms,
            "heartbeat_at_ms": w.heartbeat_at_ms, "lease_expires_at_ms": w.lease_expires_at_ms,
            "closed_at_ms": w.closed_at_ms}


def task_command(task: Any) -> list[str] | None:
    command = task.payload.get("command")
    return list(command) if isinstance(command, list) else None


def task_list_json(t: Any) -> dict[str, Any]:
    return {"project_id": t.project_id, "task_id": t.task_id, "task_revision": t.task_revision,
            "content_digest": t.content_digest, "command": task_command(t)}


def task_show_json(task: Any, limits: Any) -> dict[str, Any]:
    """A task head with its execution spec, env values masked (``task show --json``)."""
    from qinglong.contracts.errors import UserError
    from qinglong.contracts.execution import masked_payload, parse_execution_spec, spec_to_payload

    problem = None
    try:
        spec = parse_execution_spec(task.task_id, task.payload, limits, allow_sealed=True)
    except UserError as exc:
        spec, problem = None, str(exc)
    return {"project_id": task.project_id, "task_id": task.task_id,
            "task_revision": task.task_revision, "content_digest": task.content_digest,
            "execution": masked_payload(spec_to_payload(spec)) if spec is not None else None,
            "execution_error": problem, "payload": masked_payload(task.payload)}


def run_summary_json(run: Any) -> dict[str, Any]:
    """A :class:`~qinglong.contracts.execution.RunSummary` as ``runs --json`` prints it."""
    return {"run_id": run.run_id, "project_id": run.project_id, "task_id": run.task_id,
            "trigger_id": run.trigger_id, "scheduled_for_ms": run.scheduled_for_ms,
            "admitted_at_ms": run.admitted_at_ms, "lag_ms": run.admitted_at_ms - run.scheduled_for_ms,
            "state": _value(run.state), "exit_code": run.exit_code, "duration_ms": run.duration_ms,
            "attempts": run.attempts, "finished_at_ms": run.finished_at_ms, "reason": run.reason}


def attempt_json(a: Any) -> dict[str, Any]:
    """An :class:`~qinglong.contracts.execution.AttemptView` as ``runs show --json`` prints it."""
    return {"attempt_id": a.attempt_id, "attempt_no": a.attempt_no, "state": _value(a.state),
            "executor": a.executor, "created_at_ms": a.created_at_ms, "not_before_ms": a.not_before_ms,
            "started_at_ms": a.started_at_ms, "finished_at_ms": a.finished_at_ms, "exit_code": a.exit_code,
            "signal": a.signal, "duration_ms": a.duration_ms, "log_bytes": a.log_bytes,
            "log_dropped_bytes": a.log_dropped_bytes, "log_deleted": a.log_deleted,
            "attempt_dir": a.attempt_dir, "reason": a.reason, "cancel_reason": a.cancel_reason,
            "worker_id": getattr(a, "worker_id", None)}


def run_detail_json(detail: Any) -> dict[str, Any]:
    """A :class:`~qinglong.contracts.execution.RunDetail` (``runs show --json``)."""
    return {**run_summary_json(detail.run), "idempotency_key": detail.idempotency_key,
            "task_revision": detail.task_revision, "jitter_ms": detail.jitter_ms,
            "attempts": [attempt_json(a) for a in detail.attempts]}


def cancel_json(run_id: str, before: Any, after: Any) -> dict[str, Any]:
    return {"run_id": run_id, "state_before": _value(before), "state": _value(after)}


def manual_run_json(run_id: str, created: bool, key: str) -> dict[str, Any]:
    return {"run_id": run_id, "created": created, "idempotency_key": key}


def stats_json(stats: Any) -> dict[str, Any] | None:
    """A reading as ``status --json`` prints it: every field, and the oldest due's wait."""
    if stats is None:
        return None
    data = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    data["runs_by_state"] = dict(stats.runs_by_state)
    data["workers_by_state"] = dict(stats.workers_by_state)
    data["queued_by_task"] = dict(stats.queued_by_task)
    data["oldest_due_seconds"] = stats.oldest_due_seconds
    data["failing_tasks"] = [{f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
                             for t in stats.failing_tasks]
    return data


def status_json(profile: str, not_ready: str | None, finding: Any, code: int, grace: int,
                interval_ms: int | None, now: Any, before: Any) -> dict[str, Any]:
    return {"profile": profile, "ready": not_ready is None,
            "readiness": "ready" if not_ready is None else not_ready,
            "verdict": finding.verdict.name.lower() if finding else None,
            "exit_code": code, "reasons": list(finding.reasons) if finding else [],
            "grace_ms": grace, "interval_ms": interval_ms,
            "stats": stats_json(now), "before": stats_json(before)}


def fire_times_json(times_ms: list[int], iso: Any) -> list[Mapping[str, Any]]:
    return [{"at_ms": t, "at": iso(t)} for t in times_ms]
