"""``python -m qinglong``: the same as the ``qinglong`` command."""

import sys

from qinglong.host.cli import main

sys.exit(main())
