"""Secrets through the real CLI: nothing of a DSN's password reaches stdout or stderr, whatever
the DSN looks like and whatever goes wrong connecting with it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cliserver import run_qinglong

REPO = Path(__file__).resolve().parents[2]

#: A password whose pieces are distinctive: none of them occurs in any normal output.
PASSWORD = "Zq7vK Kx9p@Wm4t"
PIECES = [p for p in re.split(r"[\s@]", PASSWORD) if p]


def _cli(settings: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = str(REPO)
    env["QINGLONG_SETTINGS"] = str(settings)
    return run_qinglong(list(args), cwd=cwd, env=env, timeout=120)


def _settings(tmp_path: Path, backend: dict[str, str], extra: str = "") -> Path:
    path = tmp_path / "cluster.toml"
    # `run` tries the store for start_wait_ms before it gives up: long enough for a few of its
    # warnings (they must not leak either), not the default minute per command
    lines = ['profile = "cluster"', "[lifecycle]", "start_wait_ms = 3000", "[backend]", "pool_timeout_ms = 1000"]
    # JSON strings are TOML basic strings: the value reaches the backend exactly as given
    lines += [f"{key} = {json.dumps(value)}" for key, value in backend.items()]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def _assert_no_piece(result: subprocess.CompletedProcess[str], pieces=PIECES) -> None:
    shown = result.stdout + result.stderr
    for piece in pieces:
        assert piece not in shown, (piece, shown)
    assert "Traceback" not in shown, shown
    assert "error connecting in" not in shown, shown  # psycopg_pool's own log line


COMMANDS = [("db", "status"), ("runs",), ("db", "migrate"), ("project", "create", "ops"),
            ("run", "--for-seconds", "1")]


@pytest.mark.parametrize("form", ["keyword_space", "keyword_at_space", "uri_at", "uri_space"])
def test_a_dsn_libpq_cannot_parse_leaks_nothing_of_its_password(cluster, tmp_path, form):
    """libpq's parse error quotes the token it stopped at (``missing "=" after "Kx9p@Wm4t"``), and
    an unencoded '@' in a URI password turns the rest of it into a host name that the connection
    error and psycopg_pool's log lines print: a fragment of the password on the terminal and in
    every log collector. Each command refuses with exit 3 naming the key, quoting nothing."""
    port, db = cluster.server.port, cluster.dbname
    dsn = {
        "keyword_space": f"host=127.0.0.1 port={port} dbname={db} user=qinglong_runtime password={PASSWORD}",
        "keyword_at_space": f"host=127.0.0.1 port={port} password={PASSWORD} dbname={db}",
        "uri_at": f"postgresql://qinglong_runtime:{PASSWORD.replace(' ', '%20')}@127.0.0.1:{port}/{db}",
        "uri_space": f"postgresql://qinglong_runtime:{PASSWORD}@127.0.0.1:{port}/{db}",
    }[form]
    settings = _settings(tmp_path, {"runtime_dsn": dsn, "admin_dsn": dsn, "owner_dsn": dsn})
    for command in COMMANDS:
        result = _cli(settings, *command, cwd=tmp_path)
        _assert_no_piece(result)
        assert result.returncode == 3, (command, result.returncode, result.stderr)
        assert "_dsn" in result.stderr and "libpq" in result.stderr or "encoded" in result.stderr, result.stderr


def test_wrong_password_and_unreachable_server_are_clear_errors_without_the_password(cluster, tmp_path):
    """A wrong password or a server that is down used to end in a traceback (exit 1) whose chain
    and the pool's log lines went to stderr; the operator needs to know where it tried to connect,
    as whom, and why, without the password being printed."""
    port, db = cluster.server.port, cluster.dbname
    wrong = f"host=127.0.0.1 port={port} dbname={db} user=qinglong_runtime password='{PASSWORD}'"
    settings = _settings(tmp_path, {"runtime_dsn": wrong, "admin_dsn": wrong.replace("runtime", "admin"),
                                    "owner_dsn": wrong.replace("runtime", "owner")})
    for command in COMMANDS:
        result = _cli(settings, *command, cwd=tmp_path)
        _assert_no_piece(result)
        assert result.returncode == 5, (command, result.returncode, result.stderr)
        assert f"host=127.0.0.1 port={port} dbname={db} user=qinglong_" in result.stderr, result.stderr
        assert "password authentication failed" in result.stderr, result.stderr

    from tests.support.pg import free_port

    down = free_port()
    dead = f"postgresql://qinglong_runtime:{PASSWORD.replace(' ', '%20').replace('@', '%40')}@127.0.0.1:{down}/{db}"
    settings = _settings(tmp_path, {"runtime_dsn": dead, "admin_dsn": dead, "owner_dsn": dead})
    for command in COMMANDS:
        result = _cli(settings, *command, cwd=tmp_path)
        _assert_no_piece(result, PIECES + [PASSWORD.replace(" ", "%20").replace("@", "%40")])
        assert result.returncode == 5, (command, result.returncode, result.stderr)
        assert f"host=127.0.0.1 port={down} dbname={db} user=qinglong_runtime" in result.stderr, result.stderr


def test_config_show_masks_every_secret_whole_even_percent_encoded(cluster, tmp_path):
    """``pass%77ord`` is ``password`` to libpq and to any URI parser, but not to a masker that
    compares raw keys: `config show` printed such a password in a DSN and under a plugin's own
    settings key. Every secret-keyed value is masked whole, keys decoded first."""
    secrets = ["S1ecretInDsnQ", "S2ecretPluginKeyQ", "S3ecretInUrlQ", "S4ecretDoubleQ", "S5ecretTokenQ"]
    port, db = cluster.server.port, cluster.dbname
    extra = (
        "[plugins.settings.example]\n"
        f"'pass%77ord' = '{secrets[1]}'\n"
        f"url = 'postgresql://127.0.0.1:{port}/{db}?user=qinglong_runtime&pass%77ord={secrets[2]}'\n"
        f"other = 'host=127.0.0.1 pass%2577ord={secrets[3]}'\n"
        f"'api%2Dtoken' = '{secrets[4]}'\n"
    )
    settings = _settings(tmp_path, {
        "runtime_dsn": f"postgresql://127.0.0.1:{port}/{db}?user=qinglong_runtime&pass%77ord={secrets[0]}",
    }, extra)
    for args in (("config", "show"), ("config", "show", "--json")):
        result = _cli(settings, *args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        shown = result.stdout + result.stderr
        for secret in secrets:
            assert secret not in shown, (secret, shown)
            assert secret[:6] not in shown, (secret, shown)
        assert "**********" in result.stdout


@pytest.mark.parametrize("value", [
    "host=h pass%77ord=Zq7vKKx9pWm4t", "postgresql://u:Zq7vKKx9pWm4t@h/db", "password=Zq7vKKx9pWm4t",
])
def test_a_refused_settings_value_that_holds_a_secret_is_never_echoed(tmp_path, value):
    """A DSN pasted under the wrong key (here a number's) is refused with the key named; echoing the
    refused value would print the password, even percent-encoded where the mask cannot see it."""
    settings = tmp_path / "qinglong.toml"
    settings.write_text(f'[scheduler]\npage_size = "{value}"\n', encoding="utf-8")
    result = _cli(settings, "config", "show", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "scheduler.page_size" in result.stderr
    _assert_no_piece(result, ["Zq7vKKx9pWm4t"])
