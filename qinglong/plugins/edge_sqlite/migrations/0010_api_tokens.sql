-- 0010_api_tokens: the management API's tokens (only the SHA-256 of each secret, never the
-- secret) and the audit log of every change made through it and of every token created or
-- revoked, each entry written in the transaction of its change. A revoked token keeps its row;
-- its name is free again for a new token.
CREATE TABLE api_tokens (
    token_id      TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    digest        TEXT NOT NULL UNIQUE,
    scope         TEXT NOT NULL CHECK (scope IN ('read', 'run', 'write', 'admin')),
    projects_json TEXT NOT NULL DEFAULT '[]',
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER,
    revoked_at_ms INTEGER
);
CREATE UNIQUE INDEX api_tokens_live_name ON api_tokens (name) WHERE revoked_at_ms IS NULL;

CREATE TABLE audit_log (
    entry_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms       INTEGER NOT NULL,
    actor       TEXT NOT NULL,
    token_id    TEXT,
    source      TEXT NOT NULL,
    action      TEXT NOT NULL,
    object      TEXT NOT NULL,
    result      TEXT NOT NULL CHECK (result IN ('ok', 'refused', 'failed')),
    detail_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_by_time ON audit_log (at_ms);
