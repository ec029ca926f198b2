"""Settings: file over profile defaults under env overrides, and one-paragraph errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qinglong.contracts.errors import SettingsError
from qinglong.host.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("QINGLONG_"):
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "qinglong.toml"
    path.write_text(text)
    return path


def test_no_settings_at_all_is_the_edge_profile_with_a_sqlite_file_in_the_working_directory():
    """A newcomer with no file gets edge + ./qinglong.db, never a surprise profile."""
    loaded = load_settings()
    assert loaded.profile.name == "edge"
    assert loaded.settings.backend == {"path": "qinglong.db", "cache_kib": 512}
    assert loaded.settings.scheduler.page_size == 32


def test_file_overrides_profile_defaults_and_environment_overrides_the_file(tmp_path, monkeypatch):
    """Precedence env > file > profile, section by section (a deep merge, not a replacement)."""
    path = write(tmp_path, 'profile = "standalone"\n[scheduler]\npage_size = 100\ncadence_ms = 500\n')
    loaded = load_settings(path)
    assert loaded.profile.name == "standalone"
    assert (loaded.settings.scheduler.page_size, loaded.settings.scheduler.cadence_ms) == (100, 500)
    assert loaded.settings.backend == {"path": "qinglong.db"}  # the standalone profile's, not wiped by the file
    monkeypatch.setenv("QINGLONG_SCHEDULER__PAGE_SIZE", "64")
    loaded = load_settings(path)
    assert (loaded.settings.scheduler.page_size, loaded.settings.scheduler.cadence_ms) == (64, 500)


def test_settings_file_can_be_named_by_environment_variable(tmp_path, monkeypatch):
    path = write(tmp_path, 'profile = "standalone"\n')
    monkeypatch.setenv("QINGLONG_SETTINGS", str(path))
    assert load_settings().profile.name == "standalone"


def test_profile_option_beats_environment_and_file(tmp_path, monkeypatch):
    path = write(tmp_path, 'profile = "standalone"\n')
    monkeypatch.setenv("QINGLONG_PROFILE", "cluster")
    assert load_settings(path).profile.name == "cluster"
    assert load_settings(path, profile="edge").profile.name == "edge"


def test_missing_settings_file_is_named_with_what_named_it(tmp_path, monkeypatch):
    with pytest.raises(SettingsError, match=r"settings file .*nope.toml does not exist \(named by --settings\)"):
        load_settings(tmp_path / "nope.toml")
    monkeypatch.setenv("QINGLONG_SETTINGS", str(tmp_path / "gone.toml"))
    with pytest.raises(SettingsError, match="named by environment variable QINGLONG_SETTINGS"):
        load_settings()


def test_malformed_toml_names_the_file_and_the_line(tmp_path):
    path = write(tmp_path, "[scheduler]\npage_size = \n")
    with pytest.raises(SettingsError, match=r"qinglong.toml is not valid TOML: .*line 2"):
        load_settings(path)


def test_unknown_key_names_file_key_and_the_keys_expected(tmp_path):
    path = write(tmp_path, "[scheduler]\npagesize = 3\n")
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    message = str(err.value)
    assert f"settings file {path}" in message
    assert "key 'scheduler.pagesize': unknown key; expected one of: cadence_ms, claim_budget" in message
    assert "\n" not in message


def test_unknown_top_level_section_is_refused(tmp_path):
    path = write(tmp_path, "[schedular]\npage_size = 3\n")
    with pytest.raises(SettingsError, match="key 'schedular': unknown key"):
        load_settings(path)


def test_wrong_type_from_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("QINGLONG_SCHEDULER__CADENCE_MS", "fast")
    with pytest.raises(SettingsError, match="environment variable QINGLONG_SCHEDULER__CADENCE_MS: key 'scheduler.cadence_ms'"):
        load_settings()


def test_unknown_profile_lists_the_shipped_ones(tmp_path):
    path = write(tmp_path, 'profile = "moon"\n')
    with pytest.raises(SettingsError, match="unknown profile 'moon'; the profiles shipped are: cluster, edge, standalone"):
        load_settings(path)


def test_page_size_over_the_profile_cap_is_refused_naming_the_cap(tmp_path):
    """A user cannot make an edge round hold more than the profile allows in memory."""
    path = write(tmp_path, "[scheduler]\npage_size = 5000\n")
    with pytest.raises(SettingsError, match="5000 is over the edge profile's cap of 128"):
        load_settings(path)


def test_claim_budget_hard_cap_of_256_holds_for_cluster(tmp_path):
    path = write(tmp_path, 'profile = "cluster"\n[scheduler]\nclaim_budget = 257\n')
    with pytest.raises(SettingsError, match="257 is over the cluster profile's cap of 256"):
        load_settings(path)


def test_secret_values_are_never_echoed_in_errors(tmp_path):
    """A DSN with a password in the wrong place must not leak into the error text."""
    path = write(tmp_path, '[scheduler]\nowner = {dsn = "postgresql://u:hunter2@db/x"}\n')
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    assert "hunter2" not in str(err.value)


def test_config_show_masks_secrets_and_validates_backend_keys(cli, tmp_path):
    """config show prints the effective settings; a DSN password never appears."""
    env_file = tmp_path / "cluster.toml"
    env_file.write_text('profile = "cluster"\n[backend]\nruntime_dsn = "postgresql://rt:hunter2@127.0.0.1/ql"\n')
    result = cli("--settings", str(env_file), "config", "show", "--json")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["profile"] == "cluster"
    assert "hunter2" not in result.stdout + result.stderr
    assert shown["settings"]["backend"]["runtime_dsn"] == "**********"

    bad = tmp_path / "bad.toml"
    bad.write_text('[backend]\npath = "x.db"\nbogus = 1\n')
    result = cli("--settings", str(bad), "config", "show")
    assert result.returncode == 3
    assert f"settings file {bad}: key 'backend.bogus': unknown key; expected one of:" in result.stderr
    assert "Traceback" not in result.stderr
