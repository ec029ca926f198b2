"""Profile-neutral contracts: records, the decision function, and the plugin interface.

Nothing here imports the host, a plugin, or a database driver. A plugin author needs only this
package: :mod:`.hookspecs` (the hooks and ``hookimpl``), :mod:`.providers` (the trigger-provider
protocol), :mod:`.store` (the scheduler-backend protocols), :mod:`.capabilities` (what else the
host may ask of a backend), :mod:`.cli` (commands a plugin adds), :mod:`.decision` and
:mod:`.records`. Tests of a plugin use the kit in :mod:`qinglong.testing`.
See ``docs/plugins.md`` for the guide.
"""
