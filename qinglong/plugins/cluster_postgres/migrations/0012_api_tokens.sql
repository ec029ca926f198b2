-- capability: 10
-- The management API's tokens (only the SHA-256 of each secret, never the secret) and the audit
-- log of every change made through it and of every token created or revoked, each entry written
-- in the transaction of its change. A revoked token keeps its row; its name is free again. The
-- `qinglong api` process holds the admin role, which alone reads and writes both tables.
CREATE TABLE qinglong.api_tokens (
    token_id      text PRIMARY KEY,
    name          text NOT NULL,
    digest        text NOT NULL UNIQUE,
    scope         text NOT NULL CHECK (scope IN ('read', 'run', 'write', 'admin')),
    projects      text[] NOT NULL DEFAULT '{}',
    created_at_ms bigint NOT NULL,
    expires_at_ms bigint,
    revoked_at_ms bigint
);
CREATE UNIQUE INDEX api_tokens_live_name ON qinglong.api_tokens (name) WHERE revoked_at_ms IS NULL;

CREATE TABLE qinglong.audit_log (
    entry_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at_ms       bigint NOT NULL,
    actor       text NOT NULL,
    token_id    text,
    source      text NOT NULL,
    action      text NOT NULL,
    object      text NOT NULL,
    result      text NOT NULL CHECK (result IN ('ok', 'refused', 'failed')),
    detail      jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_by_time ON qinglong.audit_log (at_ms);

REVOKE ALL ON qinglong.api_tokens, qinglong.audit_log FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON qinglong.api_tokens TO {{admin}};
GRANT SELECT, INSERT, DELETE ON qinglong.audit_log TO {{admin}};
