"""Settings: a user's TOML file over its profile's defaults, under ``QINGLONG_*`` env overrides.

Precedence, highest first: environment (``QINGLONG_<SECTION>__<KEY>``, e.g.
``QINGLONG_SCHEDULER__PAGE_SIZE=64``), the settings file (``--settings PATH`` or
``QINGLONG_SETTINGS``), the profile file ``qinglong/profiles/<profile>.toml``. No file at all means
the edge profile with ``qinglong.db`` in the working directory.

Every mistake (missing or malformed file, unknown key, wrong type, unknown profile, a value over a
profile's cap) becomes one :class:`SettingsError` paragraph naming where the value came from and
what was expected. Secret values are never echoed.

Values from a file are strict: TOML has types, so ``page_size = true``, ``page_size = "1024"`` and
``auto_migrate = "yes"`` are refused, not read as 1, 1024 and True (:func:`strict_file_errors`;
the same holds for a plugin's own section). Environment variables are text by nature and are parsed
with pydantic's usual rules: ``QINGLONG_SCHEDULER__PAGE_SIZE=64`` is 64, and a boolean accepts
``true/false``, ``1/0``, ``yes/no``, ``on/off``. A list or a table is JSON
(``QINGLONG_API__TRUSTED_PROXIES='["10.0.0.1"]'``); one that is not is refused naming the variable.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Mapping

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, SecretStr, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from qinglong.contracts.frozen import record
from qinglong.contracts.diagnostics import redact
from qinglong.contracts.errors import SettingsError, quoted_path

from . import tomlfile
from .profiles import ProfileDefinition, load_profile

ENV_PREFIX = "QINGLONG_"
SETTINGS_ENV = "QINGLONG_SETTINGS"
PROFILE_ENV = "QINGLONG_PROFILE"
DEFAULT_PROFILE = "edge"
_SECRET_HINTS = ("dsn", "password", "secret", "token")
#: The longest duration any setting may hold: retention of a hundred years, a timeout of thirty
#: days. A bound keeps every cutoff and deadline a finite, storable number (``inf`` or ``1e300``
#: days cannot be turned into milliseconds).
MAX_RETENTION_DAYS = 36_500
#: The shortest: one millisecond. ``1e-300`` days is more than 0 but 0 ms once converted, which
#: would delete everything the moment it ends.
MIN_RETENTION_DAYS = 1 / 86_400_000
MAX_TIMEOUT_MS = 30 * 86_400_000
#: The largest byte count a setting may hold (1 PiB): more than any log filesystem, and still a
#: number every store and ``statvfs`` comparison takes as it is.
MAX_SETTING_BYTES = 2**50


def _retention_in_range(days: float) -> float:
    if not MIN_RETENTION_DAYS <= days <= MAX_RETENTION_DAYS:
        raise ValueError(f"expected from one millisecond ({MIN_RETENTION_DAYS:.3g}) to {MAX_RETENTION_DAYS} days")
    return days


#: A retention in days: finite, at least a millisecond, at most a hundred years.
RetentionDays = Annotated[float, Field(allow_inf_nan=False), AfterValidator(_retention_in_range)]


class PluginsSettings(BaseModel):
    """``[plugins]``: extra plugins to load beyond the profile's, and their own tables."""

    model_config = ConfigDict(extra="forbid")
    enable: list[str] = Field(default_factory=list, description="entry-point names to load")
    settings: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="[plugins.settings.<name>] tables handed to that plugin"
    )


class SchedulerSettings(BaseModel):
    """``[scheduler]``: the bounds of a round. Page size and claim budget are capped by the profile."""

    model_config = ConfigDict(extra="forbid")
    cadence_ms: int = Field(1000, ge=50, le=60_000)
    page_size: int = Field(32, ge=1)
    claim_budget: int = Field(16, ge=1)
    lease_ms: int = Field(30_000, ge=1_000, le=3_600_000)
    owner: str | None = Field(None, min_length=1, max_length=200)


class LifecycleSettings(BaseModel):
    """``[lifecycle]``: how long each start and stop step may take, and how long a start waits
    out a store it cannot reach (a database restarting) before it exits 5."""

    model_config = ConfigDict(extra="forbid")
    start_step_timeout_ms: int = Field(30_000, ge=100, le=600_000)
    start_wait_ms: int = Field(60_000, ge=0, le=3_600_000,
                               description="how long the start waits for a store it cannot reach")
    stop_timeout_ms: int = Field(10_000, ge=100, le=600_000)


class ExecutionSettings(BaseModel):
    """``[execution]``: how the local dispatcher runs Runs (edge and standalone). ``max_running``,
    ``max_timeout_ms`` and ``log_limit_bytes`` are capped by the profile."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="run admitted Runs' processes in `qinglong run`")
    max_running: int = Field(2, ge=1, description="processes running at once, all tasks together")
    default_timeout_ms: int = Field(3_600_000, ge=1_000, le=MAX_TIMEOUT_MS,
                                    description="a task's timeout when it states none")
    max_timeout_ms: int = Field(24 * 3_600_000, ge=1_000, le=MAX_TIMEOUT_MS,
                                description="the longest timeout a task may state")
    log_limit_bytes: int = Field(4 * 1024 * 1024, ge=0, description="a task's log limit when it states none")
    log_dir: str | None = Field(None, description="Attempt logs; default: <database>.logs beside the SQLite file")
    kill_grace_ms: int = Field(10_000, ge=100, le=600_000, description="between TERM and KILL")
    on_stop: Literal["detach", "terminate"] = Field(
        "detach", description="at SIGTERM of `qinglong run`: leave running jobs running, or stop them")
    orphans: Literal["kill", "leave"] = Field(
        "kill", description="what a job left holding its output after it exited: kill its process group, or leave it")
    orphan_drain_ms: int = Field(2_000, ge=0, le=600_000,
                                 description="how long a job's output is still read after the job exited")
    max_queued: int = Field(16, ge=1, le=100_000,
                            description="Runs of one task waiting to start; an occurrence beyond is a recorded skip "
                                        "(on the cluster the admitting replica writes it on each Run)")
    poll_ms: int = Field(1_000, ge=50, le=60_000, description="fallback wake-up of the dispatcher")
    log_retention_days: RetentionDays = Field(7,
                                      description="finished Attempts' logs are deleted after this")
    run_retention_days: RetentionDays = Field(7,
                                      description="finished Runs are pruned after this")
    skip_retention_days: RetentionDays = Field(7,
                                       description="skip records are deleted after this (kept at least an hour)")
    min_free_bytes: int = Field(64 * 1024 * 1024, ge=0, le=MAX_SETTING_BYTES,
                                description="below this free space on the log filesystem, oldest logs go first")
    min_free_fraction: float = Field(
        0.1, gt=0, le=0.5, description="the floor on a log filesystem too small for min_free_bytes: this fraction of it")
    keep_logs_per_task: int = Field(3, ge=0, le=10_000,
                                    description="the newest logs of each task that the free-space floor never deletes")
    prune_batch: int = Field(200, ge=1, le=10_000, description="rows pruned per batch")


class WorkerSettings(BaseModel):
    """``[worker]``: a ``qinglong worker`` process of the cluster profile, which pulls Runs from
    the API tier's worker gateway (``url``, with its registered token) and runs them with the
    executor plugins; it holds no database credential.
    ``max_running`` is capped by the profile; the timing must let a worker miss one heartbeat and
    still stop its jobs inside its session lease (checked at start, in words)."""

    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, min_length=1, description="the API tier's address (https://...): the worker "
                                                          "speaks to its gateway with its own token")
    token_file: str | None = Field(None, min_length=1, description="the worker's token (mode 0600), as "
                                                                 "`qinglong worker register` printed it")
    ca_file: str | None = Field(None, min_length=1, description="CA certificates (PEM) the gateway's TLS "
                                                              "certificate is checked against; default: the system's")
    claim_wait_ms: int = Field(20_000, ge=0, le=60_000,
                               description="how long a claim may wait at the gateway for a Run")
    run_as: str | None = Field(None, min_length=1, description="the OS user jobs run as (the worker itself "
                                                             "runs as root to drop to it); default: the worker's user")
    worker_id: str | None = Field(None, min_length=1, max_length=200,
                                  description="this worker's id; default: the host name")
    max_running: int = Field(2, ge=1, description="jobs running at once on this worker")
    session_lease_ms: int = Field(45_000, ge=5_000, le=600_000,
                                  description="session lease, in the store's clock")
    heartbeat_ms: int = Field(10_000, ge=500, le=300_000, description="between heartbeats")
    self_fence_margin_ms: int = Field(5_000, ge=500, le=120_000,
                                      description="jobs are gone this long before the lease can expire")
    kill_grace_ms: int = Field(10_000, ge=100, le=600_000, description="between TERM and KILL")
    orphans: Literal["kill", "leave"] = Field(
        "kill", description="what a job left holding its output after it exited: kill its process group, or leave it")
    orphan_drain_ms: int = Field(2_000, ge=0, le=600_000,
                                 description="how long a job's output is still read after the job exited")
    poll_ms: int = Field(1_000, ge=50, le=60_000, description="between claims while there are free slots")
    log_dir: str | None = Field(None, description="Attempt logs on this machine; default: ./qinglong-worker-logs")
    drain_timeout_ms: int = Field(60_000, ge=0, le=3_600_000,
                                  description="at SIGTERM: how long running jobs may finish before they are stopped")
    log_retention_days: RetentionDays = Field(7,
                                      description="local Attempt directories are deleted after this")

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, value: str | None) -> str | None:
        problem = None if value is None else http_url_problem(value)
        if problem is not None:
            raise ValueError(f"expected http(s)://HOST[:PORT] of the API tier ({problem})")
        return value


class SecretsSettings(BaseModel):
    """``[secrets]``: the key task env values are sealed under at rest (AES-GCM, 32 bytes written
    as base64 on one line). The variable ``key_env`` names is read first, then ``key_file``; edge
    and standalone default to ``<database>.key``, created on first use."""

    # Python's re for the one pattern: pydantic's Rust engine costs ~270 KiB resident to compile it.
    model_config = ConfigDict(extra="forbid", regex_engine="python-re")
    key_file: str | None = Field(None, min_length=1,
                                 description="the secrets key file; default (edge, standalone): <database>.key")
    key_env: str = Field("QINGLONG_SECRETS_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                         description="environment variable holding the key, read before key_file")
    previous_key_files: list[str] = Field(default_factory=list,
                                          description="older keys that still open values during a rotation")


class HttpSettings(BaseModel):
    """``[http]``: the read-only HTTP surface of ``qinglong run`` (probes, metrics, status page).
    Off while ``listen`` is empty; a listen address that is not loopback needs a bearer token."""

    model_config = ConfigDict(extra="forbid")
    listen: str = Field("", description='"host:port" to listen on ("[::1]:8080" for IPv6); empty: off')
    token: str | None = Field(None, min_length=16, description="bearer token every request must carry")
    token_env: str | None = Field(None, min_length=1, description="environment variable holding the token")
    max_header_bytes: int = Field(8_192, ge=1_024, le=65_536, description="request line and headers")
    max_body_bytes: int = Field(131_072, ge=0, le=1_048_576,
                                description="a request body (an API task payload holds up to 64 KiB)")
    max_connections: int = Field(16, ge=1, le=1_024, description="connections served at once")
    request_timeout_ms: int = Field(5_000, ge=100, le=120_000,
                                    description="to receive a request and answer it; idle keep-alive too")
    status_rows: int = Field(50, ge=1, le=1_000, description="rows of each table on the status page")

    @field_validator("listen")
    @classmethod
    def _listen_is_host_port(cls, value: str) -> str:
        if value:
            split_listen(value)
        return value


class ApiSettings(BaseModel):
    """``[api]``: the management API at ``/api/v1``, served on the ``[http]`` listener by ``qinglong
    run`` (and by ``qinglong api``). Every request needs a token made with ``qinglong token create``.
    A listen address off loopback needs TLS files or ``behind_proxy`` with its trusted proxies."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(False, description="serve /api/v1 on the [http] listener")
    tls_cert_file: str | None = Field(None, min_length=1, description="TLS certificate chain (PEM)")
    tls_key_file: str | None = Field(None, min_length=1, description="TLS private key (PEM)")
    behind_proxy: bool = Field(False, description="plain HTTP off loopback, only behind a TLS proxy")
    trusted_proxies: list[str] = Field(default_factory=list,
                                       description="proxy addresses whose X-Forwarded-For is believed")
    failed_auth_burst: int = Field(20, ge=1, le=10_000, description="failed authentications per address before 429")
    failed_auth_per_second: float = Field(1.0, ge=1 / 86_400, le=1_000,
                                          description="refill of that allowance; at least one a day")
    console_link_ttl_ms: int = Field(120_000, ge=1, le=3_600_000,
                                     description="a `qinglong console link` URL works once, within this")
    gateway_dsn: SecretStr | None = Field(
        None, description="the worker gateway's store connection (the gateway role; a secret): "
                          "set, /worker/v1 serves registered workers")
    gateway_pool_size: int = Field(4, ge=1, le=64, description="the gateway's database connections, "
                                                               "whatever the number of workers")
    gateway_claim_wait_ms: int = Field(20_000, ge=0, le=60_000,
                                       description="the longest a worker's claim waits for a Run")

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        import ipaddress

        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network") from None
        return value


def http_url_problem(value: str) -> str | None:
    """Why ``value`` is no ``http(s)://HOST[:PORT]`` address a client can connect to, or None.
    urllib raises ValueError only when the port is read (out of range, not digits, an IPv6
    bracket left open), so the port is read here, where the mistake can be named."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        parts.port
    except ValueError as exc:
        return str(exc) if len(str(exc)) <= 80 else "its port is not a number"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "no http or https scheme and host"
    return None


def split_listen(value: str) -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"``) as ``(host, port)``; port 0 picks a free one (named in the
    ``http.listening`` line). ValueError saying what is expected."""
    from qinglong.contracts.cli import whole_number

    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    number = whole_number(port, max_digits=5)
    if not sep or not host or number is None or not 0 <= number < 65_536:
        raise ValueError('expected "host:port" such as "127.0.0.1:8080" or "[::1]:8080"')
    return host, number


class NotificationsSettings(BaseModel):
    """``[notifications]``: where events out go (docs/events.md). Each table of ``channels`` is one
    channel: ``kind`` names a notifier (``webhook``, ``email`` or a plugin's) and the rest are its
    options."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="deliver events in `qinglong run`")
    default: Literal["on-failure", "always", "never"] = Field(
        "on-failure", description="which Run events reach the channels when a task says nothing")
    channels: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                                description="channel name -> {kind = ..., options}")
    max_tries: int = Field(8, ge=1, le=100, description="tries before a delivery is dead")
    backoff_ms: int = Field(1_000, ge=0, le=3_600_000, description="delay after the first failed try")
    backoff_cap_ms: int = Field(300_000, ge=0, le=86_400_000, description="the longest delay")
    poll_ms: int = Field(500, ge=20, le=60_000, description="between delivery passes")
    batch: int = Field(100, ge=1, le=1_000, description="events routed and deliveries sent per pass")
    lease_ms: int = Field(60_000, ge=1_000, le=3_600_000,
                          description="a claimed delivery is left to its sender this long")
    send_timeout_ms: int = Field(10_000, ge=100, le=300_000, description="one send's bound")
    concurrency: int = Field(8, ge=1, le=256, description="sends at once")
    log_lines: int = Field(20, ge=0, le=1_000, description="last log lines a message carries")
    retention_days: RetentionDays = Field(7,
                                  description="ended deliveries and their events are deleted after this")
    scheduler_not_ready_after_ms: int = Field(
        60_000, ge=1_000, le=86_400_000,
        description="a scheduler without a completed round this long is an operator event")
    queue_stalled_after_ms: int = Field(
        120_000, ge=1_000, le=86_400_000,
        description="queued Runs no live worker can take this long are an operator event (cluster)")

    @field_validator("channels")
    @classmethod
    def _channel_names(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        import re

        for name, table in value.items():
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,62}", name):
                raise ValueError(f"channel name {name!r}: expected lowercase letters, digits, _ "
                                 "and -, at most 63")
            if not isinstance(table.get("kind"), str):
                raise ValueError(f"channel {name!r}: expected kind = \"webhook\", \"email\" or a "
                                 "plugin's notifier kind")
        return value


class DiagnosticsSettings(BaseModel):
    """``[diagnostics]``: the host's stderr sink."""

    model_config = ConfigDict(extra="forbid")
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"


class _DictSource(PydanticBaseSettingsSource):
    """A settings source that returns an already parsed mapping (a TOML file we read ourselves)."""

    def __init__(self, settings_cls: type[BaseSettings], data: Mapping[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = dict(data)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class QinglongSettings(BaseSettings):
    """The effective settings of one process."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    profile: str = DEFAULT_PROFILE
    plugins: PluginsSettings = Field(default_factory=PluginsSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    lifecycle: LifecycleSettings = Field(default_factory=LifecycleSettings)
    execution: ExecutionSettings = Field(default_factory=ExecutionSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    secrets: SecretsSettings = Field(default_factory=SecretsSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    notifications: NotificationsSettings = Field(default_factory=NotificationsSettings)
    diagnostics: DiagnosticsSettings = Field(default_factory=DiagnosticsSettings)
    backend: dict[str, Any] = Field(
        default_factory=dict, description="validated by the profile's backend plugin"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        layers = _LAYERS.get()
        return (init_settings, env_settings) + tuple(_DictSource(settings_cls, data) for _, data in reversed(layers))


# The layers are handed to settings_customise_sources through a context variable, so building
# settings needs no global state and no import-time work.
import contextvars  # noqa: E402

_LAYERS: contextvars.ContextVar[tuple[tuple[str, Mapping[str, Any]], ...]] = contextvars.ContextVar(
    "qinglong_settings_layers", default=()
)


@record(slots=False)
class LoadedSettings:
    """Settings with what they were built from: the profile and where each layer came from."""

    settings: QinglongSettings
    profile: ProfileDefinition
    file: Path | None
    layers: tuple[tuple[str, Mapping[str, Any]], ...]

    def origin(self, loc: tuple[str | int, ...]) -> str:
        """Where the value at ``loc`` came from: an env var, the settings file or the profile."""
        return origin_of(loc, self.layers)


def _read_toml(path: Path, named_by: str) -> dict[str, Any]:
    try:
        exists, regular = path.exists(), path.is_file()
    except OSError as exc:  # a name too long for the file system, say
        raise SettingsError(f"settings file {quoted_path(path)} cannot be read (named by {named_by}): "
                            f"{exc.strerror}") from None
    if not exists:
        raise SettingsError(f"settings file {quoted_path(path)} does not exist (named by {named_by})")
    if not regular:
        raise SettingsError(f"settings file {quoted_path(path)} is not a regular file (named by {named_by})")
    try:
        return tomlfile.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"settings file {path} is not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"settings file {path} cannot be read: {exc.__class__.__name__}: {exc}") from None


def _lookup(data: Mapping[str, Any], loc: tuple[str | int, ...]) -> bool:
    node: Any = data
    for part in loc:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        else:
            return False
    return True


def env_name(loc: tuple[str | int, ...]) -> str:
    """The environment variable that overrides ``loc`` (``QINGLONG_SCHEDULER__PAGE_SIZE``)."""
    return ENV_PREFIX + "__".join(str(p) for p in loc).upper()


def origin_of(loc: tuple[str | int, ...], layers: tuple[tuple[str, Mapping[str, Any]], ...]) -> str:
    """Name the highest layer that holds ``loc`` (or its nearest parent)."""
    for depth in range(len(loc), 0, -1):
        prefix = loc[:depth]
        name = env_name(prefix)
        if any(k.upper() == name for k in os.environ):
            return f"environment variable {name}"
        for label, data in reversed(layers):
            if _lookup(data, prefix):
                return label
    return "the built-in defaults"


import functools  # noqa: E402  (the masking helpers below are the only users)
import re  # noqa: E402
from urllib.parse import unquote  # noqa: E402

#: Fragments of a key (percent-decoded, lower-cased, letters and digits only) that make its value
#: a secret; ``_SECRET_HINTS`` are the historical ones.
_SECRET_KEY_FRAGMENTS = tuple(sorted(set(_SECRET_HINTS) | {
    "passwd", "pwd", "passphrase", "credential", "conninfo", "apikey", "privatekey", "secretkey",
}))
#: In a value under a key that is not secret: a secret-named parameter (``password=``,
#: ``&pass%77ord=`` once decoded) or a URI's ``user:password@``.
_EMBEDDED_SECRET_PATTERN = (
    r"(?:" + "|".join(_SECRET_KEY_FRAGMENTS) + r")[a-z0-9_.-]*\s*=|[a-z][a-z0-9+.-]*://[^/@\s]*:[^@\s]*@")


@functools.cache
def _embedded_secret() -> re.Pattern[str]:
    # compiled at first use: only masking and error paths need it, and it costs ~200 KiB resident
    return re.compile(_EMBEDDED_SECRET_PATTERN, re.I)


def _decoded(text: str) -> str:
    """``text`` percent-decoded until it no longer changes (``%2577`` is ``%77`` is ``w``): what
    libpq and URI parsers will read, whatever the encoding depth."""
    for _ in range(8):
        decoded = unquote(text)
        if decoded == text:
            break
        text = decoded
    return text


def _key_is_secret(part: str | int) -> bool:
    folded = "".join(ch for ch in _decoded(str(part)).lower() if ch.isalnum())
    return any(fragment in folded for fragment in _SECRET_KEY_FRAGMENTS)


def is_secret_key(loc: tuple[str | int, ...]) -> bool:
    """True for keys whose values are secrets and must never be echoed: any part of the key path,
    percent-decoded and with separators ignored (``pass%77ord``, ``api-key``, ``runtime_dsn``),
    names a password, secret, token, DSN or credential; and every notification channel's table
    (it holds a channel's secret or a URL with a token)."""
    if tuple(loc[:2]) == ("notifications", "channels"):
        return True
    return any(_key_is_secret(part) for part in loc)


def _embeds_secret(value: str) -> bool:
    """True when a value (percent-decoded) carries a secret-named parameter or URI credentials."""
    pattern = _embedded_secret()
    return bool(pattern.search(value) or pattern.search(_decoded(value)))


def _shown_input(value: Any) -> str:
    """How a refused settings value is echoed in an error: its repr with passwords masked, or not at
    all when it carries a secret in a form the mask cannot see (``pass%77ord=...``); at most 60
    characters."""
    if isinstance(value, str) and _embeds_secret(value):
        return "a value holding a secret, not shown"
    shown = redact(repr(value))
    return shown[:57] + "..." if len(shown) > 60 else shown


def format_validation_error(
    exc: ValidationError,
    origin: Callable[[tuple[str | int, ...]], str],
    prefix: tuple[str, ...] = (),
    model: type[BaseModel] | None = None,
) -> str:
    """One paragraph: for each problem, where it came from, the key, and what was expected."""
    parts = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        renamed = _renamed_key(model, tuple(err["loc"])) if model else None
        if err["type"] == "extra_forbidden" and renamed:
            new_key = ".".join(str(p) for p in loc[:-1] + (renamed,))
            problem = f"this key was renamed; use '{new_key}' instead"
        elif err["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, tuple(err["loc"])[:-1]) if model else []
            hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
            problem = f"unknown key{hint}"
        elif err["type"] == "missing":
            problem = "a value is required"
        else:
            problem = err["msg"]
            if not is_secret_key(loc) and err["type"] not in ("missing",):
                shown = _shown_input(err.get("input"))
                problem = f"{problem} (got {shown})"
        parts.append(f"{origin(loc)}: key '{key}': {problem}")
    return "invalid settings: " + "; ".join(parts) + "."


class _FileLayer(BaseModel):
    """The shape of one settings file (every key optional), for the strict per-file pass."""

    model_config = ConfigDict(extra="forbid")
    profile: str = DEFAULT_PROFILE
    plugins: PluginsSettings = Field(default_factory=PluginsSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    lifecycle: LifecycleSettings = Field(default_factory=LifecycleSettings)
    execution: ExecutionSettings = Field(default_factory=ExecutionSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    secrets: SecretsSettings = Field(default_factory=SecretsSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    notifications: NotificationsSettings = Field(default_factory=NotificationsSettings)
    diagnostics: DiagnosticsSettings = Field(default_factory=DiagnosticsSettings)
    backend: dict[str, Any] = Field(default_factory=dict)


def strict_file_errors(
    model: type[BaseModel], data: Mapping[str, Any], label: str, prefix: tuple[str, ...] = ()
) -> str | None:
    """Type errors of ``data`` (one file's values) under ``model`` in strict mode, as one paragraph.

    Validated as JSON in strict mode: a string is never read as a number or a boolean, a boolean
    never as a number, a float never as an integer; strings still become paths and enums (a TOML
    file, like JSON, has no such types). Only type errors are reported here: ranges, required keys
    and cross-field rules are checked on the merged settings, where other layers count too.
    """
    try:
        model.model_validate_json(json.dumps(dict(data), default=str), strict=True)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            if not err["type"].endswith("_type"):
                continue
            loc = prefix + tuple(err["loc"])
            expected = err["msg"].replace("Input should be ", "expected ")
            shown = ""
            if not is_secret_key(loc):
                shown = f" (got {_shown_input(err.get('input'))})"
            key = ".".join(str(p) for p in loc)
            parts.append(f"{label}: key '{key}': {expected}{shown}; a file's values are taken as "
                         "written, never converted")
        if parts:
            return "invalid settings: " + "; ".join(parts) + "."
    return None


def _renamed_key(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The key that replaced the retired key at ``loc``, when its model names one in its
    ``RENAMED_KEYS`` class attribute (``{old key: new key}``)."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        current = fields[part].annotation
    renamed = getattr(current, "RENAMED_KEYS", None)
    return renamed.get(loc[-1]) if isinstance(renamed, dict) and loc else None


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = fields[part].annotation
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else []


def load_settings(path: str | os.PathLike[str] | None = None, *, profile: str | None = None) -> LoadedSettings:
    """Build the effective settings. Call from ``main`` (never at import time).

    ``path`` comes from ``--settings``; without it ``QINGLONG_SETTINGS`` is used; without either,
    only the profile's defaults and the environment count. ``profile`` (from ``--profile``) wins over
    the file's and the environment's ``profile``.
    """
    named_by = "--settings"
    if path is None and os.environ.get(SETTINGS_ENV):
        path, named_by = os.environ[SETTINGS_ENV], f"environment variable {SETTINGS_ENV}"
    file = Path(path) if path is not None else None
    user: dict[str, Any] = _read_toml(file, named_by) if file is not None else {}

    chosen = profile or os.environ.get(PROFILE_ENV) or user.get("profile") or DEFAULT_PROFILE
    if not isinstance(chosen, str):
        where = f"settings file {file}" if file else "the environment"
        raise SettingsError(f"{where}: key 'profile': expected a profile name such as 'edge'")
    definition = load_profile(chosen)

    layers: list[tuple[str, Mapping[str, Any]]] = [(definition.source, dict(definition.defaults))]
    if file is not None:
        layers.append((f"settings file {file}", user))
    frozen_layers = tuple(layers)
    _refuse_retired(frozen_layers)
    for label, data in frozen_layers:
        problem = strict_file_errors(_FileLayer, data, label)
        if problem:
            raise SettingsError(problem)

    token = _LAYERS.set(frozen_layers)
    try:
        # The chosen profile is passed explicitly: --profile beats the environment beats the file.
        settings = QinglongSettings(profile=chosen)
    except ValidationError as exc:
        raise SettingsError(
            format_validation_error(exc, lambda loc: origin_of(loc, frozen_layers), model=QinglongSettings)
        ) from None
    except PydanticSettingsError as exc:  # a list or table in the environment that is not JSON
        raise SettingsError(_unparsed_environment(str(exc))) from None
    finally:
        _LAYERS.reset(token)
    loaded = LoadedSettings(settings, definition, file, frozen_layers)
    _check_caps(loaded)
    return loaded


def _is_structured(annotation: Any) -> bool:
    """True for a list or table type, which pydantic-settings reads from the environment as JSON."""
    import types
    import typing

    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for candidate in typing.get_args(annotation) if union else (annotation,):
        origin = typing.get_origin(candidate) or candidate
        if origin in (list, dict, tuple, set) or (isinstance(origin, type) and issubclass(origin, BaseModel)):
            return True
    return False


def _unparsed_environment(message: str) -> str:
    """One paragraph naming the variables that should hold JSON and do not, for pydantic-settings'
    ``error parsing value for field "api"`` (which names neither; the values are never shown,
    a channel's table may hold its secret)."""
    found = re.search(r'field "([^"]+)"', message)
    field = found.group(1) if found else ""
    problems = []
    for name, value in sorted(os.environ.items()):
        parts = name.upper()[len(ENV_PREFIX):].lower().split("__") if name.upper().startswith(ENV_PREFIX) else []
        if not parts or parts[0] != field:
            continue
        model: Any = QinglongSettings
        annotation: Any = None
        for part in parts:
            fields = getattr(model, "model_fields", None)
            if not fields or part not in fields:
                annotation = None
                break
            annotation = model = fields[part].annotation
        if annotation is None or not _is_structured(annotation):
            continue
        try:
            json.loads(value)
        except ValueError:
            problems.append(f"environment variable {name}: key '{'.'.join(parts)}': expected JSON (a list such "
                            'as ["a", "b"] or a table such as {"key": "value"}); the value is not valid JSON')
    if not problems:
        problems.append(f"an environment variable {ENV_PREFIX}{field.upper()}...: a list or table there is "
                        "read as JSON, and one is not valid JSON")
    return "invalid settings: " + "; ".join(problems) + "."


#: Keys that were settings once, with what replaces each (refused in words, not as unknown).
RETIRED_KEYS = {
    ("worker", "dsn"): "a worker holds no database credential; use [worker] url and token_file from "
                       "`qinglong worker register`",
    ("worker", "labels"): "a worker's labels are bound to its registration: `qinglong worker register NAME "
                          "--label L` (or register it again)",
}


def _refuse_retired(layers: tuple[tuple[str, Mapping[str, Any]], ...]) -> None:
    for loc, instead in RETIRED_KEYS.items():
        key = ".".join(loc)
        for label, data in layers:
            if _lookup(data, loc):
                raise SettingsError(f"invalid settings: {label}: key '{key}' is no longer a setting: {instead}")
        if env_name(loc) in os.environ:
            raise SettingsError(f"invalid settings: environment variable {env_name(loc)}: key '{key}' is no "
                                f"longer a setting: {instead}")


def _check_caps(loaded: LoadedSettings) -> None:
    s, e, p = loaded.settings.scheduler, loaded.settings.execution, loaded.profile
    for section, key, value, cap in (
        ("scheduler", "page_size", s.page_size, p.page_size_cap),
        ("scheduler", "claim_budget", s.claim_budget, p.claim_budget_cap),
        ("execution", "max_running", e.max_running, p.max_running_cap),
        ("worker", "max_running", loaded.settings.worker.max_running, p.max_running_cap),
        ("execution", "max_timeout_ms", e.max_timeout_ms, p.timeout_cap_ms),
        ("execution", "log_limit_bytes", e.log_limit_bytes, p.log_limit_cap_bytes),
        ("execution", "default_timeout_ms", e.default_timeout_ms, e.max_timeout_ms),
    ):
        if value > cap:
            raise SettingsError(
                f"invalid settings: {loaded.origin((section, key))}: key '{section}.{key}': "
                f"{value} is over the {p.name} profile's cap of {cap}."
            )


def validate_section(
    loaded: LoadedSettings, section: str, model: type[BaseModel], data: Mapping[str, Any]
) -> BaseModel:
    """Validate a free-form section (``backend``, a plugin's table) with a plugin's model.

    Each file's part of the section is first checked strictly (see :func:`strict_file_errors`);
    then the merged section, environment overrides included, is validated as usual.
    """
    path = tuple(section.split("."))
    for label, layer in loaded.layers:
        part: Any = layer
        for key in path:
            part = part.get(key) if isinstance(part, Mapping) else None
        if isinstance(part, Mapping):
            problem = strict_file_errors(model, part, label, prefix=path)
            if problem:
                raise SettingsError(problem)
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise SettingsError(
            format_validation_error(exc, loaded.origin, prefix=tuple(section.split(".")), model=model)
        ) from None


def masked_dump(value: Any) -> Any:
    """A JSON-ready copy of settings with every secret replaced, whole, by ``'**********'``: every
    value under a secret key (:func:`is_secret_key`, keys percent-decoded first), whatever its type,
    and every other string that carries a secret-named parameter or URI credentials once
    percent-decoded (``postgresql://h/db?pass%77ord=...``). Nothing of a masked value is kept: a
    partly shown DSN is a partly shown password when the parser and the masker disagree."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return _mask(value, ())


def _mask(value: Any, loc: tuple[str, ...]) -> Any:
    if isinstance(value, Mapping):
        return {k: _mask(v, loc + (str(k),)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mask(v, loc) for v in value]
    if value is None or value == "":
        return value
    if is_secret_key(loc):
        return "**********"
    if isinstance(value, str) and _embeds_secret(value):
        return "**********"
    return value
