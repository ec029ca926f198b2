"""The ``nice`` executor for Qinglong: a task's command started at a lower CPU priority.

Registered under the entry point ``nice`` of group ``qinglong.plugins``; operators enable it with
``[plugins] enable = ["nice"]`` and pick it per task with ``qinglong task put ... --executor nice``.

A plugin never imports another plugin, so this one does not import the built-in
``local_process`` executor: it wraps the ``qinglong_executors`` hook (a pluggy hook wrapper), finds
the ``local_process`` executor another loaded plugin offers, and offers ``nice`` built on it. Every
process, log, receipt and signal stays that executor's; only the command changes, to
``nice -n 10 -- COMMAND...``. This module stays light: the host imports it to register the hook.
"""

from __future__ import annotations

from qinglong.contracts.execution import ExecutorSpec
from qinglong.contracts.hookspecs import hookimpl

from .executor import BASE_EXECUTOR, EXECUTOR_NAME, NICENESS, NiceExecutor

__all__ = ["BASE_EXECUTOR", "EXECUTOR_NAME", "NICENESS", "NiceExecutor", "qinglong_executors"]
__version__ = "0.1.0"


@hookimpl(wrapper=True)
def qinglong_executors():
    """Offer ``nice`` beside the ``local_process`` executor that the other plugins offered.

    Without a ``local_process`` executor (a profile that loads none) there is nothing to build on,
    and ``nice`` is not offered: a task naming it then fails, naming the executor.
    """
    offered = yield
    base = next((spec for items in offered for spec in items or ()
                 if isinstance(spec, ExecutorSpec) and spec.name == BASE_EXECUTOR), None)
    if base is None:
        return offered

    def create(context):
        return NiceExecutor(base.create(context))

    return [*offered, [ExecutorSpec(EXECUTOR_NAME, create=create,
                                    description=f"{BASE_EXECUTOR}, with the command run under nice -n {NICENESS}")]]
