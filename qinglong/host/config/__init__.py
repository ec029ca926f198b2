"""Configuration as code: apply files, their export, and importers from other schedulers.

:mod:`.document` reads an apply file into desired projects (refusals name file, line and key);
:mod:`.apply` plans and applies them through the backend's publisher, one transaction per
project, and is what the CLI (and an HTTP route) calls; :mod:`.render` writes the format;
:mod:`.crontab` and :mod:`.qinglong_v2` turn another scheduler's jobs into the same format.
Nothing here prints: the CLI formats what these return.
"""
