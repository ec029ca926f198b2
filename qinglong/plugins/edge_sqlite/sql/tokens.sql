-- name: insert_token
-- A new API token: its digest, never its secret.
INSERT INTO api_tokens (token_id, name, digest, scope, projects_json, created_at_ms, expires_at_ms)
VALUES (:token_id, :name, :digest, :scope, :projects, :created, :expires);

-- name: live_token_by_name
-- The token of this name that is not revoked, if any.
SELECT token_id, name, scope, projects_json, created_at_ms, expires_at_ms, revoked_at_ms
  FROM api_tokens WHERE name = ? AND revoked_at_ms IS NULL;

-- name: revoke_token
-- Revoke a token: it fails from its next request on.
UPDATE api_tokens SET revoked_at_ms = ? WHERE token_id = ? AND revoked_at_ms IS NULL;

-- name: list_tokens
-- Every token, newest first (revoked ones too, with the time they were revoked).
SELECT token_id, name, scope, projects_json, created_at_ms, expires_at_ms, revoked_at_ms
  FROM api_tokens ORDER BY created_at_ms DESC, token_id;

-- name: token_by_digest
-- The token whose secret hashes to this digest, read on every API request.
SELECT token_id, name, scope, projects_json, created_at_ms, expires_at_ms, revoked_at_ms
  FROM api_tokens WHERE digest = ?;

-- name: insert_audit
-- One audit entry, written in the transaction of its change.
INSERT INTO audit_log (at_ms, actor, token_id, source, action, object, result, detail_json)
VALUES (:at, :actor, :token_id, :source, :action, :object, :result, :detail);

-- name: list_audit
-- Audit entries at or after a time, newest first.
SELECT entry_id, at_ms, actor, token_id, source, action, object, result, detail_json
  FROM audit_log WHERE at_ms >= ? ORDER BY at_ms DESC, entry_id DESC LIMIT ?;

-- name: prune_audit
-- Audit entries older than the Runs' retention, oldest first, a bounded batch at a time.
DELETE FROM audit_log WHERE entry_id IN (
    SELECT entry_id FROM audit_log WHERE at_ms < :before ORDER BY entry_id LIMIT :limit);

-- name: insert_console_link
-- A console sign-in link: its code's digest, never the code.
INSERT INTO console_links (link_id, digest, created_at_ms, expires_at_ms)
VALUES (:link_id, :digest, :created, :expires);

-- name: use_console_link
-- Use a link once, before it expires: the link's id, or no row.
UPDATE console_links SET used_at_ms = :now
 WHERE digest = :digest AND used_at_ms IS NULL AND expires_at_ms > :now
RETURNING link_id;

-- name: console_link_by_digest
-- Why a link could not be used (used or expired); no row: no such link.
SELECT link_id, expires_at_ms, used_at_ms FROM console_links WHERE digest = ?;

-- name: prune_console_links
-- Links expired before a time (used or not): nothing can redeem them any more.
DELETE FROM console_links WHERE expires_at_ms < :before;
