"""Qinglong: scheduled Triggers become durable Runs, on a router or across a cluster.

The package is laid out as ``contracts`` <- ``host`` <- ``plugins``: contracts know nothing of the
host or any plugin, the host loads plugins only through entry points, and each plugin imports only
contracts and its own libraries.
"""

__version__ = "0.1.0"
