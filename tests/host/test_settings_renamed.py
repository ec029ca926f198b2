"""A retired settings key is refused by name, with the key that replaced it."""

from __future__ import annotations

import pytest

from qinglong.contracts.errors import SettingsError
from qinglong.host.settings import load_settings, validate_section
from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings


def backend_settings(loaded):
    return validate_section(loaded, "backend", ClusterPostgresSettings, loaded.settings.backend)


def test_a_file_naming_worker_ingress_role_is_told_to_use_gateway_role(cli, tmp_path):
    """Without the hint an operator upgrading a settings file sees only "unknown key" and a list
    of nine keys, and cannot tell that the gateway's role now has a name of its own."""
    path = tmp_path / "cluster.toml"
    path.write_text('profile = "cluster"\n[backend]\nworker_ingress_role = "qinglong_worker_ingress"\n')
    result = cli("--settings", str(path), "config", "show")
    assert result.returncode == 3, result.stderr
    assert (f"settings file {path}: key 'backend.worker_ingress_role': this key was renamed; "
            "use 'backend.gateway_role' instead") in result.stderr
    assert "Traceback" not in result.stderr


def test_the_environment_naming_worker_ingress_role_is_told_the_same(monkeypatch):
    monkeypatch.setenv("QINGLONG_BACKEND__WORKER_INGRESS_ROLE", "qinglong_worker_ingress")
    loaded = load_settings(profile="cluster")
    with pytest.raises(SettingsError) as err:
        backend_settings(loaded)
    message = str(err.value)
    assert ("environment variable QINGLONG_BACKEND__WORKER_INGRESS_ROLE: key "
            "'backend.worker_ingress_role': this key was renamed; use 'backend.gateway_role' instead") in message


def test_gateway_role_names_the_gateways_role(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text('profile = "cluster"\n[backend]\ngateway_role = "gw_role"\n')
    roles = backend_settings(load_settings(path)).roles()
    assert roles["gateway"] == "gw_role" and "worker_ingress" not in roles
