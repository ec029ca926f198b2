"""``qinglong worker``, a program of its own beside the host: pulls Runs from the store through the
worker protocol (:mod:`qinglong.contracts.worker`), runs them with the executor plugins (hook
``qinglong_executors``) through the same job supervisor as the local dispatcher
(:mod:`qinglong.supervisor`), ships their logs and reports their outcomes, and fences itself when
it cannot renew its session.

It has its own settings section (``[worker]``), identity (a registered worker id and token) and
deploy unit, and imports only :mod:`qinglong.contracts` and :mod:`qinglong.supervisor`: it knows the
two contracts and the executors, never a store, and never the host. The store it talks to is the
profile backend's worker protocol (hook ``qinglong_worker_protocols``), which the host's
``qinglong worker`` command builds and hands in; that command is the one place the host imports
this package (import-linter holds both rules).

* :mod:`.config`: ``[worker]`` checked once, in words naming the key;
* :mod:`.runtime`: :class:`~.runtime.Worker`, the parts put together, run and stopped;
* :mod:`.core`: what the parts share (the session, the jobs, the flags and counters);
* :mod:`.session`: the session and its heartbeat, stop orders, a session lost;
* :mod:`.jobs`: claiming, and each claimed Attempt's job from ``started`` to ``complete``;
* :mod:`.fence`: the self-fence watchdog and the worker's end of the fence keeper;
* :mod:`.keeper`: the fence keeper, a stdlib-only process that stops the jobs of a worker that was
  killed or frozen before their lease can expire;
* :mod:`.drain`: the stop in order;
* :mod:`.logship`: the local log shipped in bounded chunks at explicit offsets;
* :mod:`.retention`: old local Attempt directories deleted;
* :mod:`.http_client`: the worker protocol over HTTP(S) to the API tier's gateway (standard
  library only), with the worker's own token.

Secrets: tokens, the DSN and env values never reach a diagnostic; messages name runs and attempts.
"""

from __future__ import annotations

from .config import WorkerConfig, worker_config
from .core import WorkerStats
from .http_client import HttpWorkerProtocol, connect_http_protocol, read_token_file
from .runtime import Worker

__all__ = ["HttpWorkerProtocol", "Worker", "WorkerConfig", "WorkerStats", "connect_http_protocol",
           "read_token_file", "worker_config"]
