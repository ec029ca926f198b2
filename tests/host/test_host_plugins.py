"""Plugin loading: only what the profile names, by entry point, with errors a user can act on."""

from __future__ import annotations

import json
import subprocess
import sys

from qinglong.host.plugins import missing_extra_requirements

from host_helpers import REPO

PROVIDER = '''
from qinglong.contracts.hookspecs import hookimpl


class Provider:
    kind = "{kind}"

    def validate(self, spec):
        return dict(spec)

    def next_after(self, spec, after_ms):
        return after_ms - after_ms % 1000 + 1000

    def latest_at_or_before(self, spec, at_ms):
        return at_ms - at_ms % 1000

    def describe(self, spec):
        return "{kind}"


@hookimpl
def qinglong_trigger_providers():
    return [Provider()]
'''


def test_edge_host_imports_only_the_plugins_its_profile_names(site):
    """If the host imported every installed plugin, edge would pay psycopg's memory and risk."""
    site.add_distribution("never-loaded", {"never_loaded.py": "raise RuntimeError('imported!')\n"},
                          {"never": "never_loaded"})
    code = (
        "import sys\n"
        "from qinglong.host.settings import load_settings\n"
        "from qinglong.host.containers import build_container\n"
        "c = build_container(load_settings())\n"
        "c.lifecycle()\n"
        "print(sorted(n for n in sys.modules if n.startswith(('qinglong.plugins', 'never', 'psycopg'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=site.env(), capture_output=True, text=True,
                         cwd=site.root, check=True).stdout
    loaded = eval(out)  # a printed list of module names
    assert "qinglong.plugins.cron" in loaded and "qinglong.plugins.edge_sqlite" in loaded
    assert not [m for m in loaded if m.startswith(("qinglong.plugins.cluster_postgres", "never", "psycopg"))]


def test_unknown_plugin_name_lists_the_available_ones(cli, site, tmp_path):
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["intervall"]\n')
    result = cli("--settings", str(settings), "plugins", "--json", env=site.env())
    assert result.returncode == 3
    assert f"unknown plugin 'intervall' (named by settings file {settings})" in result.stderr
    assert "installed plugins: chain, cluster_postgres, cron, edge_sqlite" in result.stderr
    assert "Traceback" not in result.stderr


def test_broken_plugin_is_named_with_its_distribution_and_the_original_error(cli, site, tmp_path):
    site.add_distribution("acme-broken", {"acme_broken.py": "import does_not_exist_anywhere\n"},
                          {"broken": "acme_broken"}, version="2.3.4")
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["broken"]\n')
    result = cli("--settings", str(settings), "run", "--for-seconds", "0", env=site.env())
    assert result.returncode == 3
    assert ('Error importing plugin "broken" from distribution acme-broken 2.3.4: '
            "ModuleNotFoundError: No module named 'does_not_exist_anywhere'") in result.stderr
    assert "Traceback" not in result.stderr


def test_two_providers_of_one_trigger_kind_are_refused_naming_both(cli, site, tmp_path):
    """Two 'cron' providers would make occurrences depend on load order."""
    site.add_distribution("acme-cron", {"acme_cron.py": PROVIDER.format(kind="cron")}, {"acme_cron": "acme_cron"})
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["acme_cron"]\n')
    result = cli("--settings", str(settings), "trigger", "list", env=site.env())
    assert result.returncode == 3
    assert ('two plugins provide trigger kind \'cron\': "cron" (qinglong 0.1.0) and '
            '"acme_cron" (acme-cron 0.1.0)') in result.stderr


def test_misspelled_hook_is_an_error_not_silence(cli, site, tmp_path):
    """pluggy's check_pending: a typo in a hook name would otherwise silently never be called."""
    source = PROVIDER.format(kind="tick").replace("def qinglong_trigger_providers", "def qinglong_trigger_provider")
    site.add_distribution("acme-typo", {"acme_typo.py": source}, {"typo": "acme_typo"})
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["typo"]\n')
    result = cli("--settings", str(settings), "plugins", "--json", env=site.env())
    assert result.returncode == 3
    assert 'plugin "typo" from distribution acme-typo 0.1.0 implements an unknown hook' in result.stderr
    assert "qinglong_trigger_provider" in result.stderr


def test_hook_qinglong_trigger_providers_of_an_enabled_third_party_is_loaded_and_listed(cli, site, tmp_path):
    """A third party's kind must be offered and shown with its hooks, or operators cannot see it loaded."""
    site.add_distribution("acme-tick", {"acme_tick.py": PROVIDER.format(kind="tick")}, {"tick": "acme_tick"})
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["tick"]\n')
    result = cli("--settings", str(settings), "plugins", "--json", env=site.env())
    assert result.returncode == 0, result.stderr
    listed = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    assert listed["tick"] == {"name": "tick", "module": "acme_tick", "distribution": "acme-tick",
                              "version": "0.1.0", "loaded": True,
                              "hooks": ["qinglong_trigger_providers"], "selected": True}
    assert listed["cluster_postgres"]["loaded"] is False


def test_missing_extra_requirements_are_named_for_the_install_hint(site, monkeypatch):
    """The hint 'pip install qinglong[cluster]' is built from the requirements that are missing."""
    site.add_distribution("acme-host", {}, {}, requires=[
        'pluggy>=1; extra == "cluster"', 'surely-not-installed-xyz>=1; extra == "cluster"',
        'other-not-installed; extra == "edge"'])
    monkeypatch.syspath_prepend(str(site.root))
    import importlib

    importlib.invalidate_caches()
    assert missing_extra_requirements("acme-host", "cluster") == ["surely-not-installed-xyz"]
    assert missing_extra_requirements("acme-host", "edge") == ["other-not-installed"]


def test_cluster_profile_without_its_extra_says_which_pip_command_fixes_it(tmp_path):
    """Simulate an environment where psycopg is not installed: the error names the extra."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    # A sitecustomize that hides psycopg's distributions from importlib.metadata, as if uninstalled.
    (blocker / "sitecustomize.py").write_text(
        "import importlib.metadata as m\n"
        "_orig = m.distribution\n"
        "def distribution(name):\n"
        "    if name.lower().replace('_', '-') in ('psycopg', 'psycopg-pool', 'psycopg-binary'):\n"
        "        raise m.PackageNotFoundError(name)\n"
        "    return _orig(name)\n"
        "m.distribution = distribution\n"
    )
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(REPO)])
    result = subprocess.run([sys.executable, "-m", "qinglong", "--profile", "cluster", "run", "--for-seconds", "0"],
                            cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 3
    assert "the cluster profile needs psycopg, psycopg-pool, which are not installed: " \
           "pip install 'qinglong[cluster]'" in result.stderr


RIVAL_BACKEND = '''
from qinglong.contracts.hookspecs import hookimpl
from qinglong.contracts.store import SchedulerBackendSpec


class Settings:
    pass


@hookimpl
def qinglong_scheduler_backends():
    return [SchedulerBackendSpec(name="edge_sqlite", settings_model=Settings, create=lambda context: None)]
'''

NOT_A_SPEC = '''
from qinglong.contracts.hookspecs import hookimpl


@hookimpl
def qinglong_scheduler_backends():
    return [{"name": "mine"}]
'''


def test_two_plugins_offering_one_backend_name_are_refused_naming_both(cli, site, tmp_path):
    """Two 'edge_sqlite' backends would let load order decide which store holds the Runs."""
    site.add_distribution("acme-rival", {"acme_rival.py": RIVAL_BACKEND}, {"rival": "acme_rival"})
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["rival"]\n')
    result = cli("--settings", str(settings), "runs", env=site.env())
    assert result.returncode == 3
    assert ("two plugins provide scheduler backend 'edge_sqlite': \"edge_sqlite\" (qinglong 0.1.0) and "
            '"rival" (acme-rival 0.1.0)') in result.stderr


def test_a_backend_hook_returning_the_wrong_type_is_named(cli, site, tmp_path):
    site.add_distribution("acme-wrong", {"acme_wrong.py": NOT_A_SPEC}, {"wrong": "acme_wrong"})
    settings = tmp_path / "s.toml"
    settings.write_text('[plugins]\nenable = ["wrong"]\n')
    result = cli("--settings", str(settings), "runs", env=site.env())
    assert result.returncode == 3
    assert 'plugin "wrong" (acme-wrong 0.1.0) returned {\'name\': \'mine\'} from qinglong_scheduler_backends' in result.stderr
