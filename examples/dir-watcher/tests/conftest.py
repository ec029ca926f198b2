"""Make ``qinglong_dirwatch`` importable from the source tree, however pytest is invoked."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
