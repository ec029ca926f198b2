"""``[api] gateway_dsn`` names a worker gateway only the cluster's store offers: on edge and
standalone both ``qinglong api`` and ``qinglong run`` refuse it in words and change nothing.
Read and ignored by ``run``, it let an operator believe workers could reach that process, and
the workers waited for a gateway that was never there."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.cliserver import run_qinglong


@pytest.mark.parametrize("profile", ["edge", "standalone"])
@pytest.mark.parametrize("command", ["run", "api"])
def test_a_gateway_dsn_on_a_profile_without_workers_is_refused_and_creates_nothing(tmp_path, profile, command):
    secret = "gw-Sekrit-7"
    settings = tmp_path / "s.toml"
    settings.write_text(f'profile = "{profile}"\n[api]\nenabled = true\n'
                        f'gateway_dsn = "host=db user=qinglong_gateway password={secret}"\n'
                        '[http]\nlisten = "127.0.0.1:0"\n')
    settings.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}

    def qinglong(*args: str) -> subprocess.CompletedProcess:
        return run_qinglong(["--settings", str(settings), *args], cwd=tmp_path, env=env, timeout=120)

    assert qinglong("db", "migrate").returncode == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    done = qinglong(command)
    assert done.returncode == 3, done.stderr
    assert "key 'api.gateway_dsn'" in done.stderr and str(settings.name) in done.stderr
    assert f"the {profile} profile's store offers no worker gateway" in done.stderr
    assert secret not in done.stderr + done.stdout
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
