"""Settings of the ``cluster_postgres`` backend: the ``[backend]`` section of the cluster profile.

Kept free of heavy imports (no psycopg) so the host can validate settings before anything connects.
The three DSNs are secrets: they are :class:`~pydantic.SecretStr` so a settings dump or a
validation error never shows a password.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from qinglong.contracts.errors import SettingsError

_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class ClusterPostgresSettings(BaseModel):
    """``[backend]`` keys of the PostgreSQL row-lease backend. Unknown keys are refused.

    * ``runtime_dsn``: the runtime role's connection (claims, admission, reader, recovery). Needed
      to run.
    * ``admin_dsn``: the admin role's connection; needed to publish projects, tasks and triggers.
    * ``owner_dsn``: the owner/migrator role's connection; needed only to apply migrations.
    * ``*_role``: the names of the four roles, as the migrations grant to them and readiness
      verifies them; ``gateway_role`` is the worker gateway's (it replaced ``worker_ingress_role``,
      which is refused by name, see :attr:`RENAMED_KEYS`).
    * ``pool_min_size`` / ``pool_max_size``: the runtime pool; ``pool_timeout_ms`` bounds how long a
      round waits for a connection (a down server fails the round, it does not hang it).
    * ``statement_timeout_ms``: server-side bound of every statement of the backend's sessions.
    * ``serialization_retries``: how many times one admission is retried after a serialization
      failure (never after a lost fence); retries are cheap (small full-jitter backoff) and safe
      (each re-checks the fence). An admission that still fails gives its claim back at once.
    * ``auto_migrate``: apply pending migrations at start (uses ``owner_dsn``).
    """

    model_config = ConfigDict(extra="forbid")
    #: Retired keys and the key that replaced each; the settings error names both.
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"worker_ingress_role": "gateway_role"}

    runtime_dsn: SecretStr | None = None
    admin_dsn: SecretStr | None = None
    owner_dsn: SecretStr | None = None
    owner_role: str = "qinglong_owner"
    admin_role: str = "qinglong_admin"
    runtime_role: str = "qinglong_runtime"
    gateway_role: str = "qinglong_gateway"
    pool_min_size: int = Field(default=1, ge=0, le=64)
    pool_max_size: int = Field(default=4, ge=1, le=256)
    pool_timeout_ms: int = Field(default=5000, ge=100, le=600_000)
    statement_timeout_ms: int = Field(default=5000, ge=0, le=3_600_000)
    serialization_retries: int = Field(default=10, ge=0, le=100)
    auto_migrate: bool = False

    @field_validator("owner_role", "admin_role", "runtime_role", "gateway_role")
    @classmethod
    def _role_name(cls, value: str) -> str:
        if not _ROLE_NAME.match(value):
            raise ValueError(
                f"{value!r} is not a plain role name: lower-case letters, digits and '_', "
                "starting with a letter or '_', at most 63 characters"
            )
        return value

    @model_validator(mode="after")
    def _distinct_roles(self) -> "ClusterPostgresSettings":
        names = [self.owner_role, self.admin_role, self.runtime_role, self.gateway_role]
        if len(set(names)) != 4:
            raise ValueError("owner_role, admin_role, runtime_role and gateway_role must differ")
        if self.pool_min_size > self.pool_max_size:
            raise ValueError("pool_min_size must not exceed pool_max_size")
        return self

    def roles(self) -> dict[str, str]:
        """The four role names by function: ``owner``, ``admin``, ``runtime``, ``gateway``."""
        return {
            "owner": self.owner_role,
            "admin": self.admin_role,
            "runtime": self.runtime_role,
            "gateway": self.gateway_role,
        }

    def require_dsn(self, key: str, purpose: str) -> str:
        """The DSN of ``key`` (``runtime_dsn``, ``admin_dsn`` or ``owner_dsn``), or a
        :class:`SettingsError` naming the missing key and what needs it, or saying that libpq
        could not parse it (without quoting any of it: see ``db.check_dsn``)."""
        value = getattr(self, key)
        if value is None or not value.get_secret_value().strip():
            raise SettingsError(
                f"[backend] {key} is not set; the cluster_postgres backend needs it {purpose}"
            )
        from .db import check_dsn  # psycopg is needed only once something connects

        check_dsn(key, value.get_secret_value())
        return value.get_secret_value()
