"""Qinglong: scheduled Triggers become durable Runs, on a router or across a cluster.

The package is laid out in three floors, no arrow up: ``contracts`` (with ``supervisor``, the job
supervisor, a library on contracts alone) at the bottom; the programs ``host`` and ``worker`` above
them, neither importing the other (the host's ``qinglong worker`` command excepted); ``plugins``,
which the host loads only through entry points, each importing only contracts and its own
libraries. docs/architecture.md draws it.
"""

__version__ = "0.1.0"
