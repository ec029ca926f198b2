"""Error types shared by the host and every plugin.

Each error carries a message a user can act on. ``QinglongError`` subclasses that describe a user's
mistake (bad settings, a bad trigger spec, an unknown plugin) are shown as one paragraph by the CLI,
never as a stack trace.
"""

from __future__ import annotations


class QinglongError(Exception):
    """Base of every error Qinglong raises on purpose."""


class UserError(QinglongError):
    """A mistake the user can fix (input, settings, installation). Shown without a traceback."""


class TriggerSpecError(UserError):
    """A trigger spec that its provider refuses: names the field and what was expected."""

    def __init__(self, kind: str, field: str, problem: str) -> None:
        self.kind = kind
        self.field = field
        self.problem = problem
        super().__init__(f"invalid {kind} trigger: {field}: {problem}")


class UnknownTriggerKind(UserError):
    """No loaded plugin provides this trigger kind."""

    def __init__(self, kind: str, available: list[str]) -> None:
        self.kind = kind
        self.available = sorted(available)
        listed = ", ".join(self.available) or "none"
        super().__init__(
            f"unknown trigger kind {kind!r}; kinds provided by the loaded plugins: {listed}"
        )


class NotFound(UserError):
    """A project, task or trigger named by the user does not exist."""


class AlreadyExists(UserError):
    """A project or task with this identifier exists already."""


class SettingsError(UserError):
    """The settings file, a profile or an environment override is invalid."""


class PluginLoadError(UserError):
    """A plugin could not be found, imported or registered."""


class SchemaNotReady(QinglongError):
    """The database schema is missing, behind, ahead of or drifted from this version.

    Readiness fails closed: nothing is started on a database in this state.
    """


class FenceLost(QinglongError):
    """A compare-and-set or claim fence no longer matches: someone else owns the occurrence now.

    Never retried: the occurrence belongs to whoever moved the fence.
    """


class RecoveryRequired(QinglongError):
    """Startup recovery found in-flight work that does not look exactly as admission left it."""
