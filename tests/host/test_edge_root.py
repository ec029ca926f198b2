"""What an edge boot imports: only what ``qinglong run`` on a router needs."""

from __future__ import annotations

import subprocess
import sys


def _edge_boot_modules(tmp_path) -> list[str]:
    """The modules an edge ``qinglong run`` has loaded once booted (command line, settings,
    plugins, container, backend created, lifecycle), from a fresh interpreter."""
    settings = tmp_path / "s.toml"
    settings.write_text(f'[backend]\npath = "{tmp_path / "q.db"}"\n')
    code = ("import sys\n"
            "from qinglong.host.closure import boot_for_closure\n"
            f"print(repr(sorted(boot_for_closure('edge', {str(settings)!r}))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return eval(out.stdout.strip().splitlines()[-1])  # a printed list of module names


def test_edge_boot_leaves_the_publisher_and_apply_contract_unimported(tmp_path):
    """``qinglong run`` publishes nothing itself: importing the store's publisher (and the apply
    contract it brings) and its tokens module at every start would hold them for nothing."""
    modules = _edge_boot_modules(tmp_path)
    assert "qinglong.plugins.edge_sqlite.backend" in modules
    held = {"qinglong.plugins.edge_sqlite.publisher", "qinglong.plugins.edge_sqlite.tokens",
            "qinglong.contracts.apply"} & set(modules)
    assert held == set()
