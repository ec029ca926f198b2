"""The built-in ``local_process`` executor: each Attempt runs as a local process, watched by a shell.

Registered by entry point ``local_process`` (group ``qinglong.plugins``) like any third-party
plugin, and imports only :mod:`qinglong.contracts` and the standard library.

Per Attempt the executor starts ``sh -c WRAPPER qinglong-job ATTEMPT_DIR LOG_LIMIT DRAIN_MS ORPHANS --
ARGV...``
in its own session and process group. The POSIX shell wrapper (not a Python process: it costs a
router far less memory) outlives the control plane, holds the Attempt's ``lock`` for its whole
life, writes its ``pid`` first, appends the job's output to ``log`` up to the limit (the rest is
read and counted, never refused, so the job is not killed by SIGPIPE) and, when the job ended,
writes the ``receipt``. A restarted control plane learns everything from that directory.

Modules:

* :mod:`.wrapper` - the shell wrapper and the layout of an Attempt directory;
* :mod:`.procfs` - boot id and ``/proc/<pid>/stat``: what makes a handle verifiable;
* :mod:`.executor` - :class:`~.executor.LocalProcessExecutor`, the
  :class:`~qinglong.contracts.execution.Executor` itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qinglong.contracts.execution import ExecutorSpec
from qinglong.contracts.hookspecs import hookimpl

if TYPE_CHECKING:  # types only
    from qinglong.contracts.execution import Executor, ExecutorContext

EXECUTOR_NAME = "local_process"


def create_executor(context: "ExecutorContext") -> "Executor":
    """Build the executor for one ``qinglong run`` process (nothing is started here)."""
    from .executor import LocalProcessExecutor

    return LocalProcessExecutor(context)


@hookimpl
def qinglong_executors():
    """Offer the ``local_process`` executor."""
    return [ExecutorSpec(EXECUTOR_NAME, create=create_executor,
                         description="a local process in its own process group, watched by a "
                                     "shell wrapper that outlives the control plane")]
