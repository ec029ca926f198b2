"""Dependency closure per profile: nothing forbidden is imported, and the chain is named if it is."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qinglong.host.closure import import_chain
from qinglong.host.profiles import available_profiles, load_profile

LEAKY = '''
import psycopg  # a plugin that drags PostgreSQL's client into whatever profile enables it
from qinglong.contracts.hookspecs import hookimpl
'''


@pytest.mark.parametrize("profile", ["edge", "standalone", "cluster"])
def test_profile_boots_without_any_forbidden_module(cli, profile):
    """Edge must never pay for psycopg (~10 MiB) and cluster never needs the SQLite scanner."""
    result = cli("check", "closure", "--profile", profile, "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["ok"] is True and report["violations"] == [] and report["boot_error"] is None
    assert report["modules_loaded"] > 100


def test_a_forbidden_import_is_named_with_the_chain_that_pulled_it_in(cli, site):
    """The check must fail, and say which plugin to blame, when an enabled plugin imports psycopg."""
    site.add_distribution("acme-leaky", {"acme_leaky.py": LEAKY}, {"leaky": "acme_leaky"})
    settings = cli.cwd / "s.toml"
    settings.write_text('[plugins]\nenable = ["leaky"]\n')
    result = cli("check", "closure", "--profile", "edge", "--settings", str(settings), "--json", env=site.env())
    assert result.returncode == 4
    report = json.loads(result.stdout)
    violation = next(v for v in report["violations"] if v["module"] == "psycopg")
    assert violation["forbidden_by"] == "psycopg"
    assert "psycopg.pq" in violation["submodules_loaded"]
    assert [v["module"] for v in report["violations"]].count("psycopg") == 1
    assert violation["import_chain"][-3:] == ["qinglong.host.plugins", "acme_leaky", "psycopg"]
    text = cli("check", "closure", "--profile", "edge", "--settings", str(settings), env=site.env())
    assert text.returncode == 4
    assert "forbidden module psycopg (and " in text.stdout
    assert "forbidden module psycopg_binary" in text.stdout
    assert "acme_leaky -> psycopg" in text.stdout


def test_every_profile_forbids_what_the_mission_says():
    edge = load_profile("edge")
    for name in ("psycopg", "psycopg_pool", "qinglong.plugins.cluster_postgres"):
        assert name in edge.forbidden_modules
        assert name in load_profile("standalone").forbidden_modules
    assert "qinglong.plugins.edge_sqlite" in load_profile("cluster").forbidden_modules
    assert available_profiles() == ["cluster", "edge", "standalone"]


def test_edge_run_path_imports_no_ui_library(tmp_path):
    """The router's memory is for schedules, not for a terminal UI toolkit."""
    code = ("import sys\nfrom qinglong.host.closure import boot_for_closure\nboot_for_closure('edge', None)\n"
            "print([m for m in sys.modules if m.split('.')[0] in ('rich', 'click', 'typer', 'textual', "
            "'prompt_toolkit', 'colorama')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.strip() == "[]"


def test_import_chain_follows_who_imported_whom_and_stops_at_cycles():
    importer = {"psycopg.pq": "psycopg", "psycopg": "acme_leaky", "acme_leaky": "qinglong.host.plugins",
                "qinglong.host.plugins": "qinglong.host.containers", "qinglong.host.containers": "__main__",
                "a": "b", "b": "a"}
    assert import_chain(importer, "psycopg.pq") == [
        "qinglong.host.containers", "qinglong.host.plugins", "acme_leaky", "psycopg", "psycopg.pq"]
    assert import_chain(importer, "a") == ["b", "a"]
    assert import_chain(importer, "unknown") == ["unknown"]
