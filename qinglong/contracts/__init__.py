"""Profile-neutral contracts: records, the decision function, and the plugin interface.

Nothing here imports the host, a plugin, or a database driver. A plugin author needs only this
package: :mod:`.hookspecs` (the hooks and ``hookimpl``), :mod:`.providers` (the trigger-provider
protocol), :mod:`.store` (the scheduler-backend protocols), :mod:`.decision` and :mod:`.records`.
See ``docs/plugins.md`` for the guide.
"""
