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
    from qinglong.plugins.edge_sqlite.settings import EdgeSqliteSettings

    backend = EdgeSqliteSettings.model_validate(loaded.settings.backend)
    assert (backend.path, backend.cache_kib) == ("qinglong.db", 512)
    assert loaded.settings.scheduler.page_size == 128


def test_file_overrides_profile_defaults_and_environment_overrides_the_file(tmp_path, monkeypatch):
    """Precedence env > file > profile, section by section (a deep merge, not a replacement)."""
    path = write(tmp_path, 'profile = "standalone"\n[scheduler]\ncadence_ms = 500\n')
    loaded = load_settings(path)
    assert loaded.profile.name == "standalone"
    # the standalone profile's page size, not wiped by the file's [scheduler]
    assert (loaded.settings.scheduler.page_size, loaded.settings.scheduler.cadence_ms) == (256, 500)
    path = write(tmp_path, 'profile = "standalone"\n[scheduler]\npage_size = 100\ncadence_ms = 500\n')
    loaded = load_settings(path)
    assert (loaded.settings.scheduler.page_size, loaded.settings.scheduler.cadence_ms) == (100, 500)
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
    with pytest.raises(SettingsError, match=r"settings file '.*nope.toml' does not exist \(named by --settings\)"):
        load_settings(tmp_path / "nope.toml")
    monkeypatch.setenv("QINGLONG_SETTINGS", str(tmp_path / "gone.toml"))
    with pytest.raises(SettingsError, match="named by environment variable QINGLONG_SETTINGS"):
        load_settings()


def test_a_missing_settings_file_deep_in_a_tree_is_named_whole(tmp_path):
    """Error quoting cut every value after 80 characters, paths too: a settings file in a deep
    directory was named only by its first directories, never by the name that was wrong."""
    deep = tmp_path.joinpath(*["level-of-a-deep-tree"] * 8)
    with pytest.raises(SettingsError) as err:
        load_settings(deep / "nope.toml")
    assert "nope.toml'" in str(err.value) and "level-of-a-deep-tree" in str(err.value), err.value


def test_malformed_toml_names_the_file_and_the_line(tmp_path):
    path = write(tmp_path, "[scheduler]\npage_size = \n")
    with pytest.raises(SettingsError, match=r"qinglong.toml is not valid TOML: .*line 2"):
        load_settings(path)


def test_a_number_too_long_for_python_is_malformed_toml_naming_the_line(tmp_path):
    """tomllib reads a 5,000-digit integer with int(), which refuses past 4,300 digits with a
    ValueError (not a TOMLDecodeError): the settings file ended every command in a traceback."""
    path = write(tmp_path, "[scheduler]\n\npage_size = " + "1" * 5000 + "\n")
    with pytest.raises(SettingsError, match=r"qinglong.toml is not valid TOML: .*more than 4300 digits.*line 3"):
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


@pytest.mark.parametrize("text, key, expected", [
    ("[scheduler]\npage_size = true\n", "scheduler.page_size", "expected a valid integer (got True)"),
    ('[scheduler]\npage_size = "64"\n', "scheduler.page_size", "expected a valid integer (got '64')"),
    ("[scheduler]\ncadence_ms = 1000.0\n", "scheduler.cadence_ms", "expected a valid integer (got 1000.0)"),
    ('[lifecycle]\nstop_timeout_ms = "5000"\n', "lifecycle.stop_timeout_ms", "expected a valid integer"),
])
def test_settings_file_values_are_taken_as_written_never_converted(tmp_path, text, key, expected):
    """``page_size = true`` ran rounds of one schedule; a quoted number hid a typo. A file has types."""
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    assert f"settings file {path}: key '{key}': {expected}" in str(err.value)


@pytest.mark.parametrize("text, key", [
    ('[backend]\nauto_migrate = "yes"\n', "backend.auto_migrate"),
    ('[backend]\ncache_kib = "1024"\n', "backend.cache_kib"),
    ("[backend]\nbusy_timeout_ms = false\n", "backend.busy_timeout_ms"),
])
def test_backend_section_from_a_file_is_strict_too(tmp_path, text, key):
    """The backend's own model is validated strictly for a file's values: ``"yes"`` is not a boolean."""
    from qinglong.host.containers import build_container

    path = write(tmp_path, text)
    with pytest.raises(SettingsError, match=rf"settings file {path}: key '{key}': expected a valid"):
        build_container(load_settings(path)).backend_settings()


def test_environment_variables_are_text_and_are_still_parsed(monkeypatch):
    """Environment variables have no types: ``64`` and ``yes`` there are read as documented."""
    from qinglong.host.containers import build_container

    monkeypatch.setenv("QINGLONG_SCHEDULER__PAGE_SIZE", "64")
    monkeypatch.setenv("QINGLONG_BACKEND__AUTO_MIGRATE", "no")
    loaded = load_settings()
    assert loaded.settings.scheduler.page_size == 64
    assert build_container(loaded).backend_settings().auto_migrate is False


DURATION_KEYS = ("execution.log_retention_days", "execution.run_retention_days", "execution.skip_retention_days",
                 "worker.log_retention_days", "notifications.retention_days")


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e300", "36501", "1e-300", "1e-9"])
@pytest.mark.parametrize("key", DURATION_KEYS)
def test_a_duration_without_a_finite_bound_is_refused_naming_file_and_key(tmp_path, key, value):
    """``run_retention_days = inf`` ended ``run`` in an OverflowError traceback and ``1e300`` made
    every sweep fail: an unbounded duration would be accepted and break the loops that use it.
    ``1e-300`` days passed ``> 0`` and is 0 ms once in milliseconds: every finished Run, log and
    delivery would be deleted the moment it ended, the opposite of what the key says."""
    section, name = key.split(".")
    path = write(tmp_path, f"[{section}]\n{name} = {value}\n")
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    assert f"settings file {path}: key '{key}':" in str(err.value)


@pytest.mark.parametrize("key", DURATION_KEYS)
def test_a_duration_from_the_environment_is_bounded_too(monkeypatch, key):
    """The environment is text: ``inf`` there parses as a float and must meet the same bound."""
    variable = "QINGLONG_" + key.upper().replace(".", "__")
    monkeypatch.setenv(variable, "inf")
    with pytest.raises(SettingsError, match=f"environment variable {variable}: key '{key}'"):
        load_settings()


@pytest.mark.parametrize("port", ["\u00b2", "\u0668\u0660\u0668\u0660", "1" * 5000])
def test_a_listen_port_is_ascii_digits_named_in_words(tmp_path, port):
    """``"127.0.0.1:²"`` was refused with Python's "invalid literal for int()"; ``٨٠٨٠``
    (Arabic-Indic digits) was taken as port 8080 without a word."""
    path = write(tmp_path, f'[http]\nlisten = "127.0.0.1:{port}"\n')
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    assert f"settings file {path}: key 'http.listen'" in str(err.value)
    assert 'expected "host:port"' in str(err.value) and "int()" not in str(err.value)


@pytest.mark.parametrize("value", ["1e-300", "1e-6"])
def test_a_failed_authentication_refill_below_one_a_day_is_refused(tmp_path, value):
    """``failed_auth_per_second = 1e-300`` passed ``> 0``: an address that failed its burst would
    wait 10**300 seconds (a Retry-After of 301 digits), a lockout no one chose."""
    path = write(tmp_path, f"[api]\nfailed_auth_per_second = {value}\n")
    with pytest.raises(SettingsError, match=f"settings file {path}: key 'api.failed_auth_per_second'"):
        load_settings(path)


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://[::1", "http://127.0.0.1:\u00b2/",
                                 "http://127.0.0.1:-1", "http://127.0.0.1:" + "1" * 5000, "ftp://gateway"])
def test_a_worker_url_with_no_usable_port_is_refused_naming_file_and_key(tmp_path, url):
    """``[worker] url = "http://127.0.0.1:99999"`` was accepted and ended ``qinglong worker`` in a
    ValueError traceback from urllib when the worker read its port."""
    path = write(tmp_path, f'profile = "cluster"\n[worker]\nurl = "{url}"\n')
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    assert f"settings file {path}: key 'worker.url'" in str(err.value)
    assert "expected http(s)://HOST[:PORT]" in str(err.value)


@pytest.mark.parametrize("variable, value, key", [
    ("QINGLONG_API__TRUSTED_PROXIES", "10.0.0.1", "api.trusted_proxies"),
    ("QINGLONG_PLUGINS__ENABLE", "[not json", "plugins.enable"),
    ("QINGLONG_NOTIFICATIONS__CHANNELS", '{"ops": {"kind": "webhook", "secret": "hunter2-secret"', "notifications.channels"),
    ("QINGLONG_BACKEND", "{oops", "backend"),
    ("QINGLONG_NOTIFICATIONS__CHANNELS", '{"ops": {"timeout_ms": ' + "9" * 5000 + "}}", "notifications.channels"),
])
def test_a_list_or_table_from_the_environment_that_is_not_json_names_the_variable(monkeypatch, variable, value, key):
    """A list or table in an environment variable is read as JSON; ``QINGLONG_API__TRUSTED_PROXIES=10.0.0.1``
    (or a brace left open) ended every command in pydantic-settings' own exception, a traceback
    naming no variable, and a channel's secret could be in the value: it must never be echoed."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert f"environment variable {variable}: key '{key}': expected JSON" in str(err.value)
    assert "hunter2" not in str(err.value) and "99999" not in str(err.value)


def _numeric_settings() -> list[tuple[str, str, str, type]]:
    """Every number a settings file can hold: (profile, section, key, int or float), for every
    section of the host and the backend section of each profile's backend plugin."""
    from pydantic import BaseModel

    from qinglong.host.settings import QinglongSettings
    from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings
    from qinglong.plugins.edge_sqlite.settings import EdgeSqliteSettings

    models: list[tuple[str, str, type[BaseModel]]] = [
        ("edge", name, field.annotation) for name, field in QinglongSettings.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)]
    models += [("edge", "backend", EdgeSqliteSettings), ("cluster", "backend", ClusterPostgresSettings)]
    return [(profile, section, key, field.annotation) for profile, section, model in models
            for key, field in model.model_fields.items() if field.annotation in (int, float)]


NUMERIC_SETTINGS = _numeric_settings()


def _load_with_backend(path: Path | None, profile: str) -> None:
    from qinglong.host.settings import validate_section
    from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings
    from qinglong.plugins.edge_sqlite.settings import EdgeSqliteSettings

    loaded = load_settings(path, profile=profile)
    model = ClusterPostgresSettings if profile == "cluster" else EdgeSqliteSettings
    validate_section(loaded, "backend", model, loaded.settings.backend)


@pytest.mark.parametrize("profile, section, key, kind", NUMERIC_SETTINGS,
                         ids=[f"{p}-{s}.{k}" for p, s, k, _ in NUMERIC_SETTINGS])
def test_every_numeric_setting_is_bounded_from_above_in_file_and_environment(tmp_path, monkeypatch, profile,
                                                                            section, key, kind):
    """A number without an upper bound is taken as written: ``notifications.retention_days = inf``
    ended ``run`` in an OverflowError traceback, and a huge byte count or duration fails (or is
    held forever) wherever it is turned into milliseconds or bound into a statement. Every numeric
    key, from a file and from the environment, must be refused naming where it came from."""
    absurd = ("inf", "1e300") if kind is float else (str(2**63 - 1),)
    for value in absurd:
        path = write(tmp_path, f"[{section}]\n{key} = {value}\n")
        with pytest.raises(SettingsError, match=f"settings file {path}: key '{section}.{key}'"):
            _load_with_backend(path, profile)
    variable = f"QINGLONG_{section.upper()}__{key.upper()}"
    for value in absurd + (str(2**64),):
        monkeypatch.setenv(variable, value)
        with pytest.raises(SettingsError, match=f"environment variable {variable}: key '{section}.{key}'"):
            _load_with_backend(None, profile)


@pytest.mark.parametrize("key, value", [("execution.default_timeout_ms", 10**30),
                                        ("execution.max_timeout_ms", 10**30)])
def test_a_timeout_setting_is_bounded_in_its_model(tmp_path, key, value):
    """Timeouts are bounded by the model itself, not only by a profile's cap."""
    section, name = key.split(".")
    path = write(tmp_path, f"[{section}]\n{name} = {value}\n")
    with pytest.raises(SettingsError, match=f"settings file .*: key '{key}': Input should be less than"):
        load_settings(path)


def test_the_longest_retention_allowed_runs_a_sweep_without_overflow(cli, tmp_path):
    """The bound itself must still work end to end: ``run`` sweeps with a hundred years of
    retention and stops cleanly, no OverflowError and no failed sweep."""
    from qinglong.host.settings import MAX_RETENTION_DAYS

    path = tmp_path / "max.toml"
    path.write_text(f'[execution]\nlog_retention_days = {MAX_RETENTION_DAYS}\n'
                    f'run_retention_days = {MAX_RETENTION_DAYS}.0\n'
                    f'skip_retention_days = {MAX_RETENTION_DAYS}\n'
                    f'[backend]\npath = "{tmp_path / "q.db"}"\n')
    result = cli("--settings", str(path), "run", "--for-seconds", "0.5")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "retention_failed" not in result.stderr
    (tmp_path / "inf.toml").write_text("[execution]\nrun_retention_days = inf\n")
    result = cli("--settings", str(tmp_path / "inf.toml"), "run", "--for-seconds", "0.5")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "key 'execution.run_retention_days'" in result.stderr
