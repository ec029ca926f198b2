"""Local execution: the dispatcher that starts admitted Runs as processes, the reconciler that
takes over what an earlier ``qinglong run`` left, and the retention of logs and finished Runs.

The pieces work through two contracts only: the backend's
:class:`~qinglong.contracts.execution.ExecutionStore` (every state change durable, one short
transaction each) and the executors plugins offer (:class:`~qinglong.contracts.execution.Executor`,
hook ``qinglong_executors``). Nothing here knows SQLite or how a process is spawned.
"""

from __future__ import annotations

from .dispatcher import Dispatcher, DispatcherConfig
from .reconciler import reconcile
from .retention import Retention

__all__ = ["Dispatcher", "DispatcherConfig", "Retention", "reconcile"]
