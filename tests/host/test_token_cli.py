"""``qinglong token`` and ``qinglong audit`` on a real SQLite file through the real command line."""

from __future__ import annotations

import json
import sqlite3

from host_helpers import run_cli
from http_helpers import child_env, write_settings


def _cli(settings, *args):
    return run_cli(["--settings", str(settings), *args], cwd=settings.parent, env=child_env())


def test_a_token_secret_is_printed_once_and_only_its_hash_is_stored(tmp_path):
    """A secret kept in the database file (or shown again by `token list`) is stolen with any copy of
    the file or any terminal log; a token made or revoked without an audit entry cannot be traced."""
    settings = write_settings(tmp_path, http="")
    assert _cli(settings, "project", "create", "ops").returncode == 0
    made = _cli(settings, "token", "create", "deploy-bot", "--scope", "write", "--project", "ops",
                "--expires", "30d")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("qlt_") and len(secret) >= 40 and secret not in made.stderr
    raw = (tmp_path / "q.db").read_bytes()
    wal = tmp_path / "q.db-wal"
    assert secret.encode() not in raw + (wal.read_bytes() if wal.exists() else b"")
    listed = _cli(settings, "token", "list", "--json")
    assert listed.returncode == 0 and secret not in listed.stdout
    (token,) = json.loads(listed.stdout)
    assert (token["name"], token["scope"], token["projects"], token["state"]) == ("deploy-bot", "write", ["ops"], "active")
    twice = _cli(settings, "token", "create", "deploy-bot", "--scope", "read")
    assert twice.returncode == 3 and "exists already" in twice.stderr
    bad = _cli(settings, "token", "create", "x", "--scope", "read", "--expires", "soon")
    assert bad.returncode == 3 and "--expires" in bad.stderr
    assert _cli(settings, "token", "revoke", "deploy-bot").returncode == 0
    assert _cli(settings, "token", "revoke", "deploy-bot").returncode == 3
    audit = _cli(settings, "audit", "--json")
    entries = json.loads(audit.stdout)
    assert [(e["action"], e["object"], e["actor"], e["result"]) for e in entries] == [
        ("token.revoke", "deploy-bot", "cli", "ok"), ("token.create", "deploy-bot", "cli", "ok")]
    assert secret not in audit.stdout
    with sqlite3.connect(tmp_path / "q.db") as conn:
        assert conn.execute("SELECT count(*) FROM api_tokens WHERE revoked_at_ms IS NOT NULL").fetchone() == (1,)


def test_the_audit_log_is_pruned_with_the_runs_and_not_before(tmp_path):
    """An audit log kept forever fills a router's flash; one pruned sooner than the Runs loses who
    started a Run that is still listed."""
    import asyncio

    from qinglong.contracts.tokens import AuditEntry
    from qinglong.host.cli.boot import opened_backend
    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings

    settings = write_settings(tmp_path, http="")
    assert _cli(settings, "project", "create", "ops").returncode == 0

    async def scenario() -> list[str]:
        container = build_container(load_settings(settings))
        async with opened_backend(container) as backend:
            tokens = backend.tokens()
            for at, name in ((1_000, "old"), (2_000, "older-than-cut"), (10_000, "kept")):
                await tokens.record_audit(AuditEntry(at, "cli", None, "local", "token.create", name))
            await backend.execution().prune(5_000, 100)
            return [e.object for e in await tokens.list_audit()]

    assert asyncio.run(scenario()) == ["kept"]


def test_console_link_prints_a_one_time_url_of_the_listener_and_stores_only_a_digest(tmp_path):
    """A link whose code sat in the database file opens the console to anyone with a backup; one
    printed for a port picked at start points nowhere; one made through a remote API would let a
    token holder mint admin sessions."""
    settings = write_settings(tmp_path, http='listen = "127.0.0.1:8089"', extra="[api]\nenabled = true\n")
    assert _cli(settings, "project", "create", "ops").returncode == 0
    made = _cli(settings, "console", "link")
    assert made.returncode == 0, made.stderr
    url = made.stdout.strip()
    assert url.startswith("http://127.0.0.1:8089/console/link?code=qlc_") and "once" in made.stderr
    code = url.split("code=", 1)[1]
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("q.db*") if p.is_file())
    assert code.encode() not in stored
    (entry,) = json.loads(_cli(settings, "audit", "--json").stdout)
    assert (entry["action"], entry["actor"], entry["detail"]["scope"]) == ("console.link", "cli", "admin")
    (tmp_path / "picked").mkdir()
    picked = write_settings(tmp_path / "picked", extra="[api]\nenabled = true\n")
    assert _cli(picked, "project", "create", "ops").returncode == 0
    refused = _cli(picked, "console", "link")
    assert refused.returncode == 3 and "--url" in refused.stderr
    remote = run_cli(["--settings", str(settings), "--api", "http://127.0.0.1:8089", "console", "link"],
                     cwd=tmp_path, env=child_env(QINGLONG_API_TOKEN="qlt_x"))
    assert remote.returncode == 3 and "on the host" in remote.stderr


def test_the_console_link_names_the_listener_as_a_browser_reaches_it():
    """A link to 0.0.0.0 or an unbracketed IPv6 address opens nothing in a browser; plain http
    to a TLS listener fails before the code is even sent."""
    import socket
    from types import SimpleNamespace

    from qinglong.host.cli.tokens import console_base_url

    def loaded(listen: str, cert: str | None = None):
        return SimpleNamespace(settings=SimpleNamespace(http=SimpleNamespace(listen=listen),
                                                        api=SimpleNamespace(tls_cert_file=cert)))

    assert console_base_url(loaded("127.0.0.1:8080")) == "http://127.0.0.1:8080"
    assert console_base_url(loaded("[::1]:8443", "/etc/q/cert.pem")) == "https://[::1]:8443"
    assert console_base_url(loaded("0.0.0.0:8080")) == f"http://{socket.getfqdn()}:8080"


def test_a_console_link_url_whose_port_cannot_be_read_mints_nothing(tmp_path):
    """``console link --url http://[::1`` ended in a ValueError traceback from urllib, and
    ``--url http://h:99999`` minted a one-time admin code for an address no browser can open: the
    option must be refused by name, with no code made and nothing audited."""
    settings = write_settings(tmp_path, extra="[api]\nenabled = true\n")
    assert _cli(settings, "project", "create", "ops").returncode == 0
    for url in ("http://[::1", "http://127.0.0.1:99999", "http://127.0.0.1:\u00b2"):
        refused = _cli(settings, "console", "link", "--url", url)
        assert refused.returncode == 3, refused.stderr
        assert "--url: expected http://HOST:PORT or https://HOST:PORT" in refused.stderr
        assert "Traceback" not in refused.stderr
    assert json.loads(_cli(settings, "audit", "--json").stdout) == []
