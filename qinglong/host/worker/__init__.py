"""``qinglong worker``: pulls Runs from the store through the worker protocol
(:mod:`qinglong.contracts.worker`), runs them with the executor plugins (hook
``qinglong_executors``) exactly as the local dispatcher does, ships their logs and reports their
outcomes, and fences itself when it cannot renew its session.

Profile-neutral: it knows the two contracts and the executors, never a store. The store it talks
to is the profile backend's worker protocol (hook ``qinglong_worker_protocols``).

* :mod:`.config`: ``[worker]`` checked once, in words naming the key;
* :mod:`.runtime`: :class:`~.runtime.Worker` (session, heartbeat, claim, jobs, self-fence, drain);
* :mod:`.logship`: the local log shipped in bounded chunks at explicit offsets;
* :mod:`.retention`: old local Attempt directories deleted;
* :mod:`.keeper`: the fence keeper, a stdlib-only process that stops the jobs of a worker that was
  killed or frozen before their lease can expire.
"""

from __future__ import annotations

from .config import WorkerConfig, worker_config
from .runtime import Worker, WorkerStats

__all__ = ["Worker", "WorkerConfig", "WorkerStats", "worker_config"]
