"""The shipped systemd unit of `qinglong run` (standalone and edge): systemd accepts it, it waits
for readiness, it is sandboxed, it can write exactly the database and its logs, and its kill mode
keeps detached jobs alive across a restart."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from qinglong.host.settings import ExecutionSettings
from qinglong.plugins.edge_sqlite.settings import EdgeSqliteSettings

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deploy" / "systemd"
UNIT = SYSTEMD / "qinglong.service"
SHIPPED_EXEC = "/opt/qinglong/bin/qinglong"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",))
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def _qinglong_executable() -> str:
    path = Path(sys.executable).with_name("qinglong")
    assert path.exists(), f"{path} is missing: install the project (pip install -e '.[test]')"
    return str(path)


def test_unit_passes_systemd_analyze_verify(tmp_path):
    """A unit systemd cannot parse (a misspelled key, a bad value) is loaded with the line
    ignored and no error: a hardening option or the kill mode would silently not apply. verify
    reports those as warnings, so any output at all fails."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (.ci/install-system-deps installs Debian's systemd)"
    text = UNIT.read_text()
    assert text.count(f"ExecStart={SHIPPED_EXEC} ") == 1
    # verify checks that ExecStart's program exists: point it at this checkout's entry point
    copy = tmp_path / "qinglong.service"
    copy.write_text(text.replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={_qinglong_executable()} "))
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def test_sysusers_file_declares_the_units_user():
    """The unit runs as a dedicated user; if the sysusers file named another one, the service
    would fail to start on a fresh machine ("Failed to determine user credentials")."""
    unit = _unit()["Service"]
    entries = [line.split() for line in (SYSTEMD / "qinglong.sysusers.conf").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert [(e[0], e[1]) for e in entries] == [("u", unit["User"])]
    assert unit["User"] not in {"root", "0"} and unit["Group"] == unit["User"]


def test_unit_waits_for_readiness_and_runs_qinglong_run():
    """Without Type=notify systemd would call the service started as soon as it forked, before
    schema readiness and recovery: units ordered after it would start against a scheduler that
    is not admitting, and a failed readiness check would still leave the unit "active"."""
    service = _unit()["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["ExecStart"].split() == [SHIPPED_EXEC, "run"]
    assert "4" in service["RestartPreventExitStatus"].split()  # a failed readiness check: no loop


def test_unit_sandbox_options_are_set():
    """Each missing option widens what a compromised control plane or task could reach: the rest
    of the file system, new privileges through setuid programs, other users' temporary files."""
    service = _unit()["Service"]
    expected = {
        "ProtectSystem": "strict", "NoNewPrivileges": "yes", "PrivateTmp": "yes", "ProtectHome": "yes",
        "PrivateDevices": "yes", "RestrictSUIDSGID": "yes", "CapabilityBoundingSet": "",
        "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes",
    }
    assert {key: service.get(key) for key in expected} == expected


def test_unit_can_write_the_default_database_and_its_logs_directory():
    """Under ProtectSystem=strict every path not listed is read-only: if the database or the
    Attempt logs directory were outside ReadWritePaths the service would fail at its first
    write (the migration at start) or every Run would fail to open its log."""
    service = _unit()["Service"]
    writable = [PurePosixPath(p.lstrip("-")) for p in service["ReadWritePaths"].split()]
    workdir = PurePosixPath(service["WorkingDirectory"])
    assert PurePosixPath("/var/lib", service["StateDirectory"]) == workdir
    database = workdir / EdgeSqliteSettings().path  # relative to the working directory
    logs = PurePosixPath(str(database) + ".logs")  # [execution] log_dir's default: beside the database
    assert ExecutionSettings().log_dir is None
    for path in (database, PurePosixPath(str(database) + "-wal"), logs / "attempt"):
        assert any(path.is_relative_to(root) for root in writable), f"{path} is not writable"
    assert service["Environment"] == "QINGLONG_SETTINGS=/etc/qinglong/qinglong.toml"


def test_kill_mode_leaves_detached_jobs_running_across_a_restart():
    """With systemd's default KillMode=control-group (or mixed, which SIGKILLs what remains), a
    stop or restart of the unit, e.g. for an upgrade, would kill every running job although
    [execution] on_stop = "detach" promises to leave them running and re-adopt them."""
    assert ExecutionSettings().on_stop == "detach"
    service = _unit()["Service"]
    assert service["KillMode"] == "process"
    assert service["KillSignal"] == "SIGTERM"


def test_ready_notification_arrives_when_readyz_answers_200_and_stopping_at_sigterm(tmp_path):
    """Type=notify relies on the process: a READY=1 sent before /readyz turns 200 would start
    dependent units too early, one never sent would time the unit out (TimeoutStartSec) and
    restart it forever; STOPPING=1 tells systemd a stop is under way."""
    import signal
    import socket
    import time
    import urllib.error
    import urllib.request

    from tests.support.pg import free_port

    port = free_port()
    settings = tmp_path / "qinglong.toml"
    settings.write_text(f'profile = "standalone"\n[http]\nlisten = "127.0.0.1:{port}"\n')
    notify = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.settimeout(60)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QINGLONG_", "NOTIFY_"))}
    env.update(QINGLONG_SETTINGS=str(settings), NOTIFY_SOCKET=str(notify))
    command = _unit()["Service"]["ExecStart"].split()
    command[0] = _qinglong_executable()
    with open(tmp_path / "stderr", "w+") as err:
        process = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
        try:
            message = sock.recv(4096).decode()
            # READY=1 first, then /readyz; a 503 now would mean READY came early
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30) as answer:
                assert (answer.status, answer.read().decode().strip()) == (200, "ready")
            assert message.split("\n")[0] == "READY=1", message
            process.send_signal(signal.SIGTERM)
            assert sock.recv(4096).decode().split("\n")[0] == "STOPPING=1"
            assert process.wait(timeout=60) == 0
        finally:
            sock.close()
            if process.poll() is None:
                process.kill()
                process.wait()
        err.seek(0)
        logged = err.read()
    assert process.returncode == 0, logged
    assert (tmp_path / "qinglong.db").exists()  # the default path, relative to the working directory


def test_worker_unit_drains_within_its_stop_timeout_and_kills_what_is_left():
    """A TimeoutStopSec shorter than the worker's drain SIGKILLs it mid-drain at every stop or
    upgrade, leaving its jobs' outcomes unreported (they end `lost` a lease later); any KillMode
    but mixed either TERMs the jobs behind the worker's back (control-group) or leaves them
    running after the session that fenced them is gone (process)."""
    import tomllib

    from qinglong.host.settings import WorkerSettings

    parser = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",))
    parser.optionxform = str
    parser.read_string((SYSTEMD / "qinglong-worker.service").read_text())
    service = parser["Service"]
    assert service["ExecStart"].split() == [SHIPPED_EXEC, "worker"]
    assert service["KillMode"] == "mixed" and service["KillSignal"] == "SIGTERM"
    settings = tomllib.loads((SYSTEMD / "worker.toml").read_text())
    assert settings["profile"] == "cluster"
    worker = WorkerSettings.model_validate(settings["worker"])
    stop_s = int(service["TimeoutStopSec"])
    assert stop_s >= (worker.drain_timeout_ms + worker.kill_grace_ms) / 1000 + 10
    assert service["User"] == _unit()["Service"]["User"]
    assert worker.log_dir.startswith(service["WorkingDirectory"] + "/")
    assert PurePosixPath("/var/lib", service["StateDirectory"]) == PurePosixPath(service["WorkingDirectory"])


def test_api_unit_passes_verify_and_serves_qinglong_api_from_its_settings(tmp_path):
    """An API unit systemd half-ignores runs without its sandbox; one pointing at settings that
    refuse to start (a plain address off loopback) restarts forever instead of failing once."""
    import tomllib

    from qinglong.host.settings import load_settings

    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (.ci/install-system-deps installs Debian's systemd)"
    text = (SYSTEMD / "qinglong-api.service").read_text()
    assert text.count(f"ExecStart={SHIPPED_EXEC} api\n") == 1
    copy = tmp_path / "qinglong-api.service"
    copy.write_text(text.replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={_qinglong_executable()} "))
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr
    parser = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",))
    parser.optionxform = str
    parser.read_string(text)
    service = parser["Service"]
    assert service["Environment"] == "QINGLONG_SETTINGS=/etc/qinglong/api.toml"
    assert "3" in service["RestartPreventExitStatus"].split()
    settings = tomllib.loads((SYSTEMD / "api.toml").read_text())
    assert settings["http"]["listen"].startswith("127.0.0.1:")
    load_settings(SYSTEMD / "api.toml")  # the shipped file loads
    assert "api.toml" in (SYSTEMD / "install.sh").read_text()
