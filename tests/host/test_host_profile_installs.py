"""Each profile installed from the project's own files into a fresh virtualenv, as an operator would.

These build real wheels and virtualenvs (pip, from the package index or its cache), so they are
marked ``slow``. They prove what unit tests cannot: ``pip install 'qinglong[edge]'`` brings no
psycopg, the installed wheel carries its profiles and migrations, the closure holds in an
environment that has only what the profile's extra installs, and a third party's plugin installed
next to it is discovered, validated and run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from host_helpers import REPO, StderrLines, wait_until

pytestmark = pytest.mark.slow

FORBIDDEN_ON_EDGE = {"psycopg", "psycopg-binary", "psycopg-c", "psycopg-pool"}


class Venv:
    """A virtualenv with one profile of Qinglong installed (not editable)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"

    def run(self, *args: str, cwd: Path, check: bool = True, timeout: float | None = None,
            env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("QINGLONG_", "PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env.update(env_extra or {})
        result = subprocess.run([str(self.bin / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def run_until(self, condition, what: str, *args: str, cwd: Path, timeout: float = 1800,
                  env_extra: dict[str, str] | None = None) -> str:
        """Start ``args`` (a long-running command), poll ``condition`` until it holds, then SIGTERM:
        the command stops on the condition, not after a fixed time. Returns its stderr."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("QINGLONG_", "PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env.update(env_extra or {})
        proc = subprocess.Popen([str(self.bin / args[0]), *args[1:]], cwd=cwd, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stderr = StderrLines(proc.stderr)
        try:
            wait_until(condition, what, timeout=timeout, alive=proc)
            proc.send_signal(signal.SIGTERM)
            proc.wait()  # bounded by the test's hang bound
        finally:
            proc.kill() if proc.poll() is None else None
        text = stderr.finish()
        if proc.returncode != 0:
            raise AssertionError(f"{args} failed ({proc.returncode}):\n{text}")
        return text

    def distributions(self, cwd: Path) -> dict[str, str]:
        listed = json.loads(self.run("python", "-m", "pip", "list", "--format", "json", cwd=cwd).stdout)
        return {d["name"].lower(): d["version"] for d in listed}


def make_venv(root: Path, requirement: str) -> Venv:
    # no bound of its own: on a loaded machine creating a venv takes minutes; a hang still fails
    # through the test's hang bound (pytest-timeout)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    venv = Venv(root)
    venv.run("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", requirement,
             cwd=root)
    return venv


#: Build output and caches the copy leaves out.
_NOT_SOURCE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                     ".hypothesis", "results", "venv*", ".venv")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tree to build from. pip builds a local directory in place, rewriting its
    ``*.egg-info``; the checkout's copy is on the suite's ``sys.path`` (``pythonpath = ["."]``), so
    a build there would, for a moment, leave every other test seeing no plugin installed."""
    root = tmp_path_factory.mktemp("source") / "qinglong"
    shutil.copytree(REPO, root, ignore=_NOT_SOURCE, symlinks=True)
    return root


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory, source: Path) -> dict[str, Venv]:
    """One virtualenv per profile, built lazily."""
    built: dict[str, Venv] = {}

    class Lazy(dict):
        def __missing__(self, profile: str) -> Venv:
            root = tmp_path_factory.mktemp(f"venv-{profile}")
            built[profile] = make_venv(root / "venv", f"{source}[{profile}]")
            self[profile] = built[profile]
            return built[profile]

    return Lazy()


@pytest.mark.parametrize("profile", ["edge", "standalone", "cluster", "worker"])
def test_profile_extra_installs_nothing_forbidden_and_its_closure_holds(venvs, profile, tmp_path):
    """If psycopg slipped into qinglong[edge], every router would carry PostgreSQL's client; if it
    slipped into qinglong[worker], every worker host would carry a database driver it must not use."""
    venv = venvs[profile]
    installed = venv.distributions(tmp_path)
    assert "qinglong" in installed
    if profile == "worker":
        assert not (FORBIDDEN_ON_EDGE | {"aiosqlite", "starlette", "uvicorn", "cryptography"}) & set(installed), \
            installed
    elif profile in ("edge", "standalone"):
        assert not FORBIDDEN_ON_EDGE & set(installed), installed
        assert {"aiosqlite", "cryptography"} <= set(installed)
    else:
        assert {"psycopg", "psycopg-binary", "psycopg-pool", "cryptography"} <= set(installed)
    result = venv.run("qinglong", "check", "closure", "--profile", profile, "--installed", "--json",
                      cwd=tmp_path, check=False)
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["ok"] and report["installed_distributions_checked"]


def test_cluster_profile_in_an_edge_install_names_the_extra_to_install(venvs, tmp_path):
    result = venvs["edge"].run("qinglong", "--profile", "cluster", "run", "--for-seconds", "0",
                               cwd=tmp_path, check=False)
    assert result.returncode == 3
    assert "pip install 'qinglong[cluster]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_installed_wheel_runs_the_main_job(venvs, tmp_path):
    """The wheel must carry the profile files and the SQLite migrations, not just the tree."""
    result = venvs["edge"].run("qinglong", "demo", "--seconds", "2.2", cwd=tmp_path)
    assert "demo-every-second" in result.stdout
    assert (tmp_path / "qinglong.db").exists()


def test_third_party_interval_plugin_is_discovered_validated_listed_and_runs(venvs, source, tmp_path):
    """A real third-party distribution, installed by pip next to Qinglong, extends the trigger kinds."""
    venv = venvs["edge"]
    venv.run("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             str(source / "examples" / "interval-trigger"), cwd=tmp_path)
    settings = tmp_path / "qinglong.toml"
    settings.write_text('[plugins]\nenable = ["interval"]\n')
    env = {"QINGLONG_SETTINGS": str(settings)}

    listed = json.loads(venv.run("qinglong", "plugins", "--json", cwd=tmp_path, env_extra=env).stdout)
    interval = next(p for p in listed["plugins"] if p["name"] == "interval")
    assert interval["loaded"] is True and interval["selected"] is True
    assert interval["distribution"] == "qinglong-interval-trigger"
    assert interval["hooks"] == ["qinglong_trigger_cli_options", "qinglong_trigger_providers"]

    # Without the settings it is installed but not loaded: nothing is imported that was not named.
    plain = json.loads(venv.run("qinglong", "plugins", "--json", cwd=tmp_path).stdout)
    assert next(p for p in plain["plugins"] if p["name"] == "interval")["loaded"] is False

    for args in (("project", "create", "ops"), ("task", "put", "ops", "ping", "--command", "true")):
        venv.run("qinglong", *args, cwd=tmp_path, env_extra=env)
    bad = venv.run("qinglong", "trigger", "add", "ops", "fast", "--task", "ping", "--kind", "interval",
                   "--spec", '{"every_ms": 10}', cwd=tmp_path, env_extra=env, check=False)
    assert bad.returncode == 3
    assert "invalid interval trigger: every_ms" in bad.stderr
    venv.run("qinglong", "trigger", "add", "ops", "every-second", "--task", "ping", "--kind", "interval",
             "--spec", '{"every_ms": 1000}', cwd=tmp_path, env_extra=env)
    def runs():
        return json.loads(venv.run("qinglong", "runs", "--json", cwd=tmp_path, env_extra=env).stdout)

    venv.run_until(lambda: len(runs()) >= 2, "two Runs of the interval trigger", "qinglong", "run",
                   cwd=tmp_path, env_extra=env)
    runs = runs()
    assert len(runs) >= 2
    assert all(r["idempotency_key"].startswith("ql3:interval:v1:every-second:1:") for r in runs)

    closure = venv.run("qinglong", "check", "closure", "--profile", "edge", "--installed", "--json",
                       cwd=tmp_path, env_extra=env, check=False)
    assert closure.returncode == 0, closure.stdout + closure.stderr


def test_third_party_nice_executor_and_the_plugin_authors_kit_work_from_installed_wheels(venvs, source,
                                                                                         tmp_path):
    """A second kind of third-party plugin, an executor, installed by pip: its entry point loads,
    ``task put --executor nice`` is accepted and ``qinglong run`` runs the job through it. The
    wheel must also carry ``qinglong.testing`` (importable without pytest) and the cron plugin's
    ``cron next``, or plugin authors would get a kit and a command that exist only in the tree."""
    venv = venvs["edge"]
    venv.run("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             str(source / "examples" / "nice-executor"), cwd=tmp_path)
    kit = venv.run("python", "-c", "import sys, qinglong.testing, qinglong.testing.provider_laws, "
                   "qinglong.testing.conformance.harness; print('pytest' in sys.modules, "
                   "'hypothesis' in sys.modules)", cwd=tmp_path)
    assert kit.stdout.split() == ["False", "False"]
    preview = venv.run("qinglong", "cron", "next", "@daily", "--after", "2024-01-01T00:00:00Z", "--count", "1",
                       cwd=tmp_path)
    assert preview.stdout.startswith("cron '@daily' in UTC, after 2024-01-01T00:00:00.000Z:")
    settings = tmp_path / "qinglong.toml"
    settings.write_text('[plugins]\nenable = ["nice"]\n')
    env = {"QINGLONG_SETTINGS": str(settings)}
    listed = json.loads(venv.run("qinglong", "plugins", "--json", cwd=tmp_path, env_extra=env).stdout)
    nice = next(p for p in listed["plugins"] if p["name"] == "nice")
    assert (nice["loaded"], nice["distribution"], nice["hooks"]) == (True, "qinglong-nice-executor",
                                                                     ["qinglong_executors"])
    venv.run("qinglong", "project", "create", "ops", cwd=tmp_path, env_extra=env)
    venv.run("qinglong", "task", "put", "ops", "niced", "--executor", "nice", "--", "sh", "-c",
             'echo "niceness $(nice)"', cwd=tmp_path, env_extra=env)
    run_id = json.loads(venv.run("qinglong", "task", "run", "ops", "niced", "--json", cwd=tmp_path,
                                 env_extra=env).stdout)["run_id"]

    def ended():
        runs = json.loads(venv.run("qinglong", "runs", "--json", cwd=tmp_path, env_extra=env).stdout)
        return [r for r in runs if r["run_id"] == run_id and r["state"] not in ("queued", "dispatching", "running")]

    venv.run_until(ended, "the niced Run to end", "qinglong", "run", cwd=tmp_path, env_extra=env)
    [run] = ended()
    assert (run["state"], run["exit_code"]) == ("succeeded", 0), run
    shown = venv.run("qinglong", "logs", run_id, cwd=tmp_path, env_extra=env).stdout.strip()
    assert shown.startswith("niceness ") and int(shown.split()[1]) >= 10


def test_plugins_lists_every_installed_plugin_in_a_cluster_install_without_settings(venvs, tmp_path):
    """With only the cluster extra and no settings, the default edge profile lacks aiosqlite: ``plugins
    --json`` exited 3 and printed nothing, so the one command meant to explain an installation went
    dark exactly when it was needed. It lists what is installed and says why the profile cannot load."""
    venv = venvs["cluster"]
    result = venv.run("qinglong", "plugins", "--json", cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    listed = json.loads(result.stdout)
    assert listed["profile"] == "edge" and listed["profile_loadable"] is False
    assert "aiosqlite" in listed["profile_error"] and "pip install 'qinglong[edge]'" in listed["profile_error"]
    names = {p["name"]: p for p in listed["plugins"]}
    assert {"cron", "edge_sqlite", "cluster_postgres"} <= set(names)
    assert names["cron"]["loaded"] is True and names["cluster_postgres"]["loaded"] is False

    text = venv.run("qinglong", "plugins", cwd=tmp_path).stdout
    assert "profile: edge (cannot be loaded here: the edge profile needs aiosqlite" in text
    cluster = json.loads(venv.run("qinglong", "--profile", "cluster", "plugins", "--json", cwd=tmp_path).stdout)
    assert cluster["profile_loadable"] is True and cluster["profile_error"] is None
    assert {p["name"]: p["loaded"] for p in cluster["plugins"]}["cluster_postgres"] is True
