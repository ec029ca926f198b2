"""The host's diagnostic sinks: stderr lines (text or JSON) and a fan-out that never raises."""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Sequence

from qinglong.contracts.diagnostics import LEVELS, DiagnosticEvent, DiagnosticSink


class StderrSink:
    """Writes events at or above ``level`` to a stream, one line each."""

    def __init__(self, level: str = "info", fmt: str = "text", stream: IO[str] | None = None) -> None:
        self.threshold = LEVELS.index(level)
        self.fmt = fmt
        self.stream = stream

    def emit(self, event: DiagnosticEvent) -> None:
        """Write one line if the event's level passes the threshold."""
        if LEVELS.index(event.level) < self.threshold if event.level in LEVELS else False:
            return
        stream = self.stream or sys.stderr
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if self.fmt == "json":
            line = json.dumps(
                {"at": stamp, "level": event.level, "code": event.code, "message": event.message,
                 **dict(event.fields)},
                default=str,
            )
        else:
            extra = " ".join(f"{k}={v}" for k, v in event.fields.items())
            line = f"{stamp} {event.level:<7} {event.code}: {event.message}" + (f" [{extra}]" if extra else "")
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not stop the scheduler


class FanoutSink:
    """Redacts each event once and hands it to every sink; a sink that raises is dropped."""

    def __init__(self, sinks: Sequence[DiagnosticSink], fallback: StderrSink) -> None:
        self.sinks = list(sinks)
        self.fallback = fallback

    def emit(self, event: DiagnosticEvent) -> None:
        """Deliver ``event`` (redacted) to every sink; never raises."""
        safe = event.redacted()
        for sink in list(self.sinks):
            try:
                sink.emit(safe)
            except Exception as exc:  # a broken sink must not break the loop that reports
                self.sinks.remove(sink)
                self.fallback.emit(
                    DiagnosticEvent(
                        "error",
                        "diagnostics.sink_failed",
                        f"diagnostic sink {type(sink).__name__} raised {exc.__class__.__name__}; it is disabled",
                    )
                )
