"""An example event source: a Run for each file that appears in a watched directory (README.md).

The event id of a file is its name and modification time (hashed when long), so the same file
unchanged is the same event: seen again after a restart it admits nothing, and a file rewritten
is a new event.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import os
from typing import Any, Mapping

from qinglong.contracts.diagnostics import DiagnosticEvent
from qinglong.contracts.errors import TriggerSpecError
from qinglong.contracts.event_sources import MAX_EVENT_ID_CHARS, EventSourceContext
from qinglong.contracts.hookspecs import ComponentPhase, hookimpl, plugin_settings

KIND = "dir_watch"


class DirWatchProvider:
    kind = KIND

    def validate(self, spec: Mapping[str, Any]) -> Mapping[str, Any]:
        if not isinstance(spec, Mapping):
            raise TriggerSpecError(KIND, "spec", "expected a table with path and pattern")
        unknown = sorted(str(k) for k in spec if k not in ("path", "pattern"))
        if unknown:
            raise TriggerSpecError(KIND, unknown[0], "unknown key (expected path, pattern)")
        path = spec.get("path")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise TriggerSpecError(KIND, "path", "expected an absolute directory path")
        pattern = spec.get("pattern", "*")
        if not isinstance(pattern, str) or not pattern or "/" in pattern:
            raise TriggerSpecError(KIND, "pattern", "expected a file name pattern such as *.csv")
        return {"path": os.path.normpath(path), "pattern": pattern}

    def next_after(self, spec: Mapping[str, Any], after_ms: int) -> int | None:
        return None

    def latest_at_or_before(self, spec: Mapping[str, Any], at_ms: int) -> int | None:
        return None

    def describe(self, spec: Mapping[str, Any]) -> str:
        return f"files {spec['pattern']} appearing in {spec['path']}"


def event_id(name: str, mtime_ns: int) -> str:
    ident = f"{name}@{mtime_ns}"
    if len(ident) <= MAX_EVENT_ID_CHARS and ident.isprintable():
        return ident
    return "sha256:" + hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()


class DirWatchSource:
    name = "dir-watch"
    phase = ComponentPhase.STACK

    def __init__(self, context: EventSourceContext, poll_ms: int) -> None:
        self._context = context
        self._poll_s = poll_ms / 1000
        self._seen: set[tuple[str, str]] = set()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def scan_once(self) -> int:
        """One look at every watched directory; the number of Runs admitted."""
        admitted = 0
        for head in await self._context.triggers(KIND):
            path, pattern = head.spec["path"], head.spec["pattern"]
            try:
                entries = [e for e in os.scandir(path) if e.is_file(follow_symlinks=False)]
            except OSError as exc:
                self._context.diagnostics.emit(DiagnosticEvent(
                    "warning", "dirwatch.unreadable", f"cannot read {path}: {exc.strerror}",
                    {"trigger_id": head.trigger_id}))
                continue
            for entry in sorted(entries, key=lambda e: e.name):
                if not fnmatch.fnmatchcase(entry.name, pattern):
                    continue
                stat = entry.stat(follow_symlinks=False)
                ident = event_id(entry.name, stat.st_mtime_ns)
                if (head.trigger_id, ident) in self._seen:
                    continue
                result = await self._context.admit(KIND, head.trigger_id, ident,
                                                   {"path": entry.path, "size": stat.st_size})
                self._seen.add((head.trigger_id, ident))
                admitted += int(result.created)
        return admitted

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.scan_once()
            except Exception as exc:  # reported, never fatal: the next look tries again
                self._context.diagnostics.emit(DiagnosticEvent(
                    "error", "dirwatch.scan_failed", f"{exc.__class__.__name__}: {exc}"))
            try:
                await asyncio.wait_for(self._stopping.wait(), self._poll_s)
            except asyncio.TimeoutError:
                pass

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="dirwatch")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task


@hookimpl
def qinglong_trigger_providers():
    return [DirWatchProvider()]


@hookimpl
def qinglong_event_sources(context: EventSourceContext):
    poll_ms = plugin_settings(context.settings, "dirwatch").get("poll_ms", 1000)
    if not isinstance(poll_ms, int) or not 50 <= poll_ms <= 3_600_000:
        raise ValueError("[plugins.settings.dirwatch] poll_ms: expected 50 to 3600000")
    return [DirWatchSource(context, poll_ms)]
