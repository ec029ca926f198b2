"""The read-only status page at ``/``: server-rendered HTML, no script, no build step, one column on
a phone. Every value is HTML-escaped; every table holds at most ``[http] status_rows`` rows."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from html import escape
from typing import Any, Iterable, Sequence

from qinglong.contracts.observe import STATS_READ_TIMEOUT_MS, StoreStats, assess, workers_summary
from qinglong.contracts.records import NO_MORE_OCCURRENCES_MS

STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;max-width:60rem;padding:.75rem;color:#111}
h1{font-size:1.3rem;margin:.2rem 0}h2{font-size:1.05rem;margin:1.2rem 0 .3rem}
.v0{color:#176117}.v10{color:#8a5a00}.v20{color:#a11}.v30{color:#a11}.muted{color:#666}
table{border-collapse:collapse;width:100%;display:block;overflow-x:auto}
th,td{text-align:left;padding:.25rem .5rem;border-bottom:1px solid #ddd;white-space:nowrap}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.15rem .8rem;margin:0}dt{color:#555}dd{margin:0}
"""
VERDICT_NAMES = {0: "clear", 10: "converging", 20: "attention", 30: "failing"}


def _utc(ms: int | None) -> str:
    if ms is None:
        return "–"
    if ms >= NO_MORE_OCCURRENCES_MS:  # a trigger never due (a hook): past any date's range
        return "never"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%m-%d %H:%M:%S")


def _queued(by_task: Any) -> str:
    """The per-task queue depths, deepest first (none: "none")."""
    return ", ".join(f"{task} {n}" for task, n in sorted(by_task.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def _seconds(ms: int | None) -> str:
    if ms is None:
        return "–"
    return f"{ms / 1000:.3f} s" if abs(ms) < 10_000 else f"{ms / 1000:.0f} s"


def _table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> str:
    rows = list(rows)
    if not rows:
        return f"<h2>{escape(title)}</h2><p class=muted>{escape(empty)}</p>"
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<h2>{escape(title)}</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


async def _bounded(awaitable: Any, what: str, problems: list[str]) -> Any:
    try:
        return await asyncio.wait_for(awaitable, STATS_READ_TIMEOUT_MS / 1000)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        problems.append(f"{what}: {'timed out' if isinstance(exc, asyncio.TimeoutError) else exc.__class__.__name__}")
        return None


async def render_status_page(lifecycle: Any, cache: Any, profile: str, version: str, rows: int) -> str:
    """The page: summary and verdict, schedules (next fire, lag), recent Runs (state, exit code),
    recent skips, workers. A read that fails shows what failed instead of its table."""
    problems: list[str] = []
    stats: StoreStats | None = await cache.refresh()
    if cache.last_error:
        problems.append(f"store figures: {cache.last_error} (showing the last ones)")
    reader = lifecycle.backend.reader()
    schedules = await _bounded(reader.list_schedules(limit=rows), "schedules", problems) or ()
    skips = await _bounded(reader.recent_skips(limit=rows), "skips", problems) or ()
    from qinglong.contracts.capabilities import runs_of

    store = runs_of(lifecycle.backend)  # what `qinglong runs` reads: here or on the workers' store
    if store is not None:
        runs = await _bounded(store.list_runs(limit=rows), "runs", problems) or ()
        run_rows = [(f"{r.project_id}/{r.trigger_id or r.task_id}", getattr(r.state, "value", r.state),
                     "–" if r.exit_code is None else r.exit_code, _utc(r.scheduled_for_ms),
                     _seconds(r.admitted_at_ms - r.scheduled_for_ms), r.reason or "") for r in runs]
    else:
        runs = await _bounded(reader.recent_runs(limit=rows), "runs", problems) or ()
        run_rows = [(f"{r.project_id}/{r.trigger_id}", r.state, "–", _utc(r.scheduled_for_ms),
                     _seconds(r.admitted_at_ms - r.scheduled_for_ms), "") for r in runs]
    now_ms = stats.now_ms if stats is not None else time.time_ns() // 1_000_000
    readiness = lifecycle.readiness
    parts = [f"<h1>Qinglong · {escape(profile)}</h1>",
             f"<p class=muted>version {escape(version)} · {escape(_utc(now_ms))} UTC · "
             f"{escape(readiness.reason)}</p>"]
    if stats is not None:
        from .metrics import grace_of

        grace = cache.grace_ms if cache.grace_ms is not None else grace_of(lifecycle)
        finding = assess(cache.before, stats, grace_ms=grace)
        name = VERDICT_NAMES.get(int(finding.verdict), str(int(finding.verdict)))
        reasons = "; ".join(finding.reasons) or "nothing needs attention"
        runs_by_state = ", ".join(f"{k} {v}" for k, v in sorted(stats.runs_by_state.items()) if v) or "none"
        parts.append(f"<p class=v{int(finding.verdict)}><strong>{escape(name)}</strong>: {escape(reasons)}</p>")
        parts.append("<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in (
            ("schedules", f"{stats.schedules_enabled} enabled of {stats.schedules_total}"),
            ("backlog", f"{stats.schedules_due} due, oldest {_seconds(int(stats.oldest_due_seconds * 1000))}"),
            ("admission lag", f"p50 {_seconds(stats.admission_lag_p50_ms)}, p99 {_seconds(stats.admission_lag_p99_ms)}"
                              f" over {stats.admitted_in_window} admissions (5 min)"),
            ("runs", runs_by_state),
            ("queued per task", _queued(stats.queued_by_task)),
            ("running", str(stats.running)),
            ("skipped (1 h)", str(stats.skipped_recent)),
            ("lost (1 h)", str(stats.lost_recent)),
            ("grace", _seconds(grace)),
        ) + ((("workers", workers_summary(stats)),) if stats.worker_free_slots is not None else ())) + "</dl>")
    for problem in problems:
        parts.append(f"<p class=v20>could not read {escape(problem)}</p>")
    parts.append(_table("Schedules", ("trigger", "next fire (UTC)", "late by", "enabled", "kind"), (
        (f"{s.project_id}/{s.trigger_id}", _utc(s.next_fire_at_ms),
         _seconds(now_ms - s.next_fire_at_ms) if s.next_fire_at_ms is not None and s.enabled
         and s.next_fire_at_ms <= now_ms else "–", "yes" if s.enabled else "no", s.kind)
        for s in list(schedules)[:rows]), "no schedules"))
    parts.append(_table("Recent runs", ("run of", "state", "exit code", "scheduled (UTC)", "admission lag", "reason"),
                        run_rows[:rows], "no runs yet"))
    if stats is not None and stats.tasks_failing:
        parts.append(_table(f"Failing tasks ({stats.tasks_failing})", (
            "task", "last outcome", "ended (UTC)", "failures in a row", "succeeded (24 h)", "last success (UTC)"), (
            (f"{t.project_id}/{t.task_id}", t.last_outcome, _utc(t.last_finished_at_ms), t.failure_streak,
             f"{t.succeeded_in_window} of {t.ended_in_window}", _utc(t.last_success_at_ms))
            for t in stats.failing_tasks[:rows]), "no failing task"))
    parts.append(_table("Skipped occurrences", ("trigger", "policy", "skipped", "from (UTC)", "to (UTC)"), (
        (f"{k.project_id}/{k.trigger_id}", k.policy.value, f"{k.count}{'' if k.count_exact else '+'}",
         _utc(k.first_skipped_ms), _utc(k.last_skipped_ms)) for k in list(skips)[:rows]), "no skips recorded"))
    if stats is not None and stats.worker_free_slots is not None:
        parts.append(_table("Workers", ("state", "count"), stats.workers_by_state.items(), "no workers"))
        parts.append(f"<p>free worker slots: {escape(str(stats.worker_free_slots))}; queued runs no live "
                     f"worker can take: {escape(str(stats.runs_without_worker or 0))}</p>")
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content='width=device-width,initial-scale=1'>"
            "<meta http-equiv=refresh content=10><title>Qinglong status</title>"
            f"<style>{STYLE}</style></head><body>" + "".join(parts) + "</body></html>")
