"""Profile files (TOML) shipped inside the wheel: ``edge``, ``standalone``, ``cluster``.

Each has a ``[profile]`` table (plugins to load, the scheduler backend, the extra it needs, the caps a
user cannot exceed, and the modules and distributions it must never load) and a ``[defaults]`` table
with the same sections as a user's settings file, which the user's file overrides.
"""
