"""Helpers for host tests: throwaway plugin distributions and the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class SitePath:
    """A folder put on PYTHONPATH that holds plugin modules and their ``.dist-info`` metadata.

    ``importlib.metadata`` finds a ``<name>-<version>.dist-info`` folder on ``sys.path`` exactly as it
    finds a pip-installed distribution, so a plugin written here is discovered through its entry
    point like any third party's, without touching the real environment.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add_distribution(
        self,
        name: str,
        modules: dict[str, str],
        entry_points: dict[str, str],
        version: str = "0.1.0",
        requires: list[str] | None = None,
    ) -> None:
        """Write ``modules`` (file name -> source) and a dist-info registering ``entry_points``."""
        for filename, source in modules.items():
            path = self.root / filename
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
        info = self.root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        lines = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in requires or []]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
        eps = "[qinglong.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
        (info / "entry_points.txt").write_text(eps)
        (info / "RECORD").write_text("")

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose PYTHONPATH starts with this folder (and the repository)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), str(REPO)])
        env.update(extra)
        return env




def run_cli(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120,
            python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    """Run ``python -m qinglong ARGS`` in ``cwd`` and capture its output."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env["PYTHONPATH"] = str(REPO)
    return subprocess.run([python, "-m", "qinglong", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
