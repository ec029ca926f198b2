"""Plan and apply desired projects through a backend's publisher: the library behind
``qinglong apply`` and ``qinglong import`` (and the API's apply route). It never prints.

Every project is planned first in a rolled-back transaction (a dry run), so a refusal that only
the store can see (a trigger id another project uses) is found before anything is written; then
each project is applied in its own transaction. With ``prune``, projects the file does not name
are deleted (within ``projects`` when a scope is given).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from qinglong.contracts.frozen import record
from qinglong.contracts.apply import (
    DesiredProject,
    PlanRefused,
    ProjectPlan,
    ProjectState,
    plan_project,
    plans_summary,
    validate_desired,
)


@record(slots=False)
class ApplyOptions:
    """``prune``: delete what the desired state does not name; ``dry_run``: write nothing;
    ``projects``: only these project ids (None: every project)."""

    prune: bool = False
    dry_run: bool = False
    projects: frozenset[str] | None = None


@dataclass
class ApplyReport:
    """The plans, in the order they were (or would be) applied, and whether they were written."""

    plans: list[ProjectPlan] = field(default_factory=list)
    applied: bool = False
    offline: bool = False

    @property
    def writes(self) -> bool:
        """True when the plans change the store."""
        return any(plan.writes for plan in self.plans)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form: never a value, only what changes."""
        return {"applied": self.applied, "dry_run": not self.applied, "counts": plans_summary(self.plans),
                "projects": [plan.to_json() for plan in self.plans]}


def _scoped(desired: Mapping[str, DesiredProject], options: ApplyOptions) -> list[DesiredProject]:
    return [desired[pid] for pid in sorted(desired)
            if options.projects is None or pid in options.projects]


async def apply_projects(backend: Any, desired: Mapping[str, DesiredProject], options: ApplyOptions,
                         *, refusal: Any = None) -> ApplyReport:
    """Plan every project (a dry run each), then, unless ``options.dry_run``, apply each in its
    own transaction. ``refusal(PlanRefused)`` may turn a refusal into the caller's error (an
    apply file names its line); by default it is raised as it is."""
    publisher = backend.publisher()
    chosen = _scoped(desired, options)
    doomed: list[str] = []
    if options.prune:
        stored = [p.project_id for p in await backend.reader().list_projects()]
        doomed = [pid for pid in stored if pid not in desired
                  and (options.projects is None or pid in options.projects)]
    try:
        report = ApplyReport()
        for project in chosen:
            report.plans.append(await publisher.apply_project(project, prune=options.prune, dry_run=True))
        for project_id in doomed:
            report.plans.append(await publisher.delete_project(project_id, dry_run=True))
        if options.dry_run or not report.writes:
            report.applied = not options.dry_run
            return report
        applied = ApplyReport(applied=True)
        for project in chosen:
            applied.plans.append(await publisher.apply_project(project, prune=options.prune))
        for project_id in doomed:
            applied.plans.append(await publisher.delete_project(project_id))
        return applied
    except PlanRefused as exc:
        if refusal is None:
            raise
        raise refusal(exc) from None


def plan_offline(desired: Mapping[str, DesiredProject], options: ApplyOptions,
                 providers: Mapping[str, Any], limits: Any = None, *, leased: bool = False,
                 refusal: Any = None) -> ApplyReport:
    """The plan against a store that does not exist yet (a dry run before the first apply on
    edge): everything is a create. The same checks and the same plan function as a store's."""
    report = ApplyReport(offline=True)
    try:
        for project in _scoped(desired, options):
            checked = validate_desired(project, providers, limits, leased=leased)
            report.plans.append(plan_project(checked, ProjectState.absent(project.project_id),
                                             prune=options.prune))
    except PlanRefused as exc:
        if refusal is None:
            raise
        raise refusal(exc) from None
    return report


def format_plan(report: ApplyReport) -> Iterable[str]:
    """The plan as the terminal shows it: one line per object, ``+`` create, ``~`` update (with
    the changed keys, never a value), ``=`` unchanged, ``-`` delete; then a summary line."""
    marks = {"create": "+", "update": "~", "unchanged": "=", "delete": "-"}
    for plan in report.plans:
        counts = plan.counts()
        yield (f"project {plan.project_id}: {counts['create']} to create, {counts['update']} to update, "
               f"{counts['unchanged']} unchanged, {counts['delete']} to delete")
        for change in plan.changes:
            detail = f" ({', '.join(change.fields)})" if change.fields else ""
            name = change.object_id if change.kind.value == "project" else f"{plan.project_id}/{change.object_id}"
            yield f"  {marks[change.action.value]} {change.kind.value} {name}{detail}"
    total = plans_summary(report.plans)
    summary = (f"{total['create']} to create, {total['update']} to update, {total['unchanged']} unchanged, "
               f"{total['delete']} to delete")
    if not report.applied:
        yield f"dry run: {summary}; nothing written" + (" (the store does not exist yet)" if report.offline else "")
    elif report.writes:
        yield f"applied: {summary.replace('to create', 'created').replace('to update', 'updated').replace('to delete', 'deleted')}"
    else:
        yield "nothing to change: the store already matches"
