"""The HTTP surface of ``qinglong run``: ``/livez``, ``/readyz``, ``/metrics`` and the status page
at ``/``, one ``admission``-phase lifecycle component (opened last at start, withdrawn first at stop).

Off unless ``[http] listen`` is set (the standalone and cluster profiles set it; edge does not), and
nothing of it (prometheus_client, Starlette, uvicorn) is imported while it is off. The server is
uvicorn's h11 server with a Starlette application, from the ``http`` (or ``api``) extra: chosen by
measured import cost on edge (docs/http.md).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any, Callable, Sequence

from qinglong.contracts.errors import SettingsError

from ..settings import LoadedSettings, split_listen


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; a host name is taken as reachable from afar."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(loaded: LoadedSettings) -> bytes | None:
    """The bearer token (``[http] token``, or the variable ``[http] token_env`` names), or None.

    Refused, naming the key and never the value: ``token_env`` naming an unset or empty variable,
    and a listen address that is not loopback without any token.
    """
    http = loaded.settings.http
    token = http.token
    if http.token_env:
        value = os.environ.get(http.token_env, "")
        if not value:
            raise SettingsError(
                f"invalid settings: {loaded.origin(('http', 'token_env'))}: key 'http.token_env': "
                f"environment variable {http.token_env} is not set or empty.")
        if len(value) < 16:
            raise SettingsError(
                f"invalid settings: {loaded.origin(('http', 'token_env'))}: key 'http.token_env': "
                f"the token in {http.token_env} is shorter than 16 characters.")
        token = value
    host, _ = split_listen(http.listen)
    if token is None and not is_loopback(host):
        raise SettingsError(
            f"invalid settings: {loaded.origin(('http', 'listen'))}: key 'http.listen': "
            f"{http.listen} is not a loopback address, so the HTTP surface needs a bearer token: "
            "set [http] token or [http] token_env.")
    return token.encode() if token is not None else None


def require_http_extra(loaded: LoadedSettings) -> None:
    """Refuse, naming the key and the extra, an HTTP surface whose packages are not installed."""
    import importlib.util

    missing = [name for name in ("starlette", "uvicorn", "h11") if importlib.util.find_spec(name) is None]
    if missing:
        raise SettingsError(
            f"invalid settings: {loaded.origin(('http', 'listen'))}: key 'http.listen': serving HTTP needs "
            f"{', '.join(missing)}: install the extra 'http' (pip install 'qinglong[http]').")


def check_api_exposure(loaded: LoadedSettings, *, always: bool = False) -> tuple[str, str] | None:
    """The TLS files to serve with, or None for plain HTTP; refused, naming the key: the API on
    without a listener, and the API off loopback without TLS files or ``behind_proxy`` with its
    trusted proxies."""
    api, http = loaded.settings.api, loaded.settings.http
    if (api.tls_cert_file is None) != (api.tls_key_file is None):
        raise SettingsError(f"invalid settings: {loaded.origin(('api', 'tls_cert_file'))}: keys 'api.tls_cert_file' "
                            "and 'api.tls_key_file' go together: set both or neither.")
    files = (api.tls_cert_file, api.tls_key_file) if api.tls_cert_file and api.tls_key_file else None
    for key, path in zip(("tls_cert_file", "tls_key_file"), files or ()):
        if not os.path.isfile(path):
            raise SettingsError(f"invalid settings: {loaded.origin(('api', key))}: key 'api.{key}': "
                                f"no such file {path}.")
    if not api.enabled and not always:
        return files
    if not http.listen:
        raise SettingsError(f"invalid settings: {loaded.origin(('api', 'enabled'))}: key 'api.enabled': the API "
                            "is served on the [http] listener: set [http] listen too.")
    host, _ = split_listen(http.listen)
    if not is_loopback(host) and files is None and not (api.behind_proxy and api.trusted_proxies):
        raise SettingsError(
            f"invalid settings: {loaded.origin(('http', 'listen'))}: key 'http.listen': {http.listen} is not a "
            "loopback address, so the API needs TLS ([api] tls_cert_file and tls_key_file) or "
            "[api] behind_proxy = true with the proxy addresses in [api] trusted_proxies.")
    return files


def admission_factory(loaded: LoadedSettings, version: str) -> Callable[[Any], Sequence[Any]] | None:
    """``lifecycle -> [HttpSurface]`` when ``[http] listen`` is set (the token checked now, before
    anything starts), else None."""
    if not loaded.settings.http.listen:
        if loaded.settings.api.enabled:
            check_api_exposure(loaded)
        return None
    require_http_extra(loaded)
    token = resolve_token(loaded)
    ssl_files = check_api_exposure(loaded)
    # Only the profile's own default may fail to bind without failing the start: several processes
    # of one host (test suites, a second replica) would otherwise fight over 127.0.0.1:8080. An
    # address the operator set is a promise: failing to keep it fails the start.
    required = loaded.origin(("http", "listen")) != loaded.profile.source

    def build(lifecycle: Any) -> Sequence[Any]:
        from .server import HttpSurface

        api = build_api(loaded, lifecycle.backend, lifecycle.providers) if loaded.settings.api.enabled else None
        return [HttpSurface(lifecycle, loaded.settings.http, token, loaded.profile.name, version,
                            required=required, api=api, api_settings=loaded.settings.api, ssl_files=ssl_files)]

    return build


def build_api(loaded: LoadedSettings, backend: Any, providers: Any) -> Any:
    """The management API over ``backend`` (:class:`.api.ApiService`)."""
    from ..cli.status import grace_ms
    from ..cli.task import execution_limits
    from .api import ApiService

    scheduler = loaded.settings.scheduler

    class _Limits:
        cadence_ms = scheduler.cadence_ms
        lease_ms = scheduler.lease_ms

    return ApiService(backend, profile=loaded.profile.name, execution_limits=execution_limits(loaded),
                      providers=providers, grace_ms=grace_ms(loaded.profile.name, _Limits))
