"""Execution: what a task runs, the Run/Attempt state machine, and the pure decisions around it.

Everything here is pure and profile-neutral, so the local dispatcher of the edge and standalone
profiles and the cluster's remote workers share it unchanged. One module per concern:

* :mod:`.states` — the state machine: :data:`RUN_TRANSITIONS` says which actor may move a Run
  from which state to which, :func:`check_run_transition` enforces it;
* :mod:`.spec` — :class:`ExecutionSpec`, the part of a task revision that says what to run and
  how (parsed from the task payload by :func:`parse_execution_spec`, refused key by key);
* :mod:`.outcomes` — :func:`classify_outcome`, the terminal state an Attempt ends in, from the
  evidence only (a completion receipt, a durable cancel request; never ``succeeded`` without a
  receipt), and :func:`retry_decision`: after an Attempt ended, retry at T, or stop;
* :mod:`.overlap` — :func:`overlap_decision`: may this Run start now, given what of its task runs;
* :mod:`.executors` — the :class:`Executor` protocol plugins implement, and a job's environment;
* :mod:`.store` — :class:`ExecutionStore`, the execution side of a local store;
* :mod:`.control` — :class:`RunControl`, reading and controlling Runs executed elsewhere;
* :mod:`.skips` — how long skip records are kept (:func:`skip_cutoff_ms`).

Every name stays importable from ``qinglong.contracts.execution``; new code may import the module
that holds it. Times are integer epoch milliseconds; durations are milliseconds.
"""

from __future__ import annotations

from . import control, executors, outcomes, overlap, skips, spec, states, store
from .control import *  # noqa: F403
from .executors import *  # noqa: F403
from .outcomes import *  # noqa: F403
from .overlap import *  # noqa: F403
from .skips import *  # noqa: F403
from .spec import *  # noqa: F403
from .states import *  # noqa: F403
from .store import *  # noqa: F403

__all__ = [*states.__all__, *spec.__all__, *outcomes.__all__, *overlap.__all__, *executors.__all__,
           *store.__all__, *control.__all__, *skips.__all__]
