"""``python -m qinglong.host.cli``: the same as the ``qinglong`` script."""

import sys

from .main import main

sys.exit(main())
