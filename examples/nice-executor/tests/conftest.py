"""Make ``qinglong_nice`` importable from the source tree, however pytest is invoked.

An installed copy (``pip install ./examples/nice-executor``) works too; the tree comes first so
the tests always exercise the code beside them.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
