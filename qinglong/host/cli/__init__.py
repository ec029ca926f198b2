"""The ``qinglong`` command line: :func:`main` is the console script's entry point.

:mod:`.main` parses the command line and maps every error to its exit code; each command group
is one module holding its parser setup beside the functions it calls.
"""

from .main import main

__all__ = ["main"]
