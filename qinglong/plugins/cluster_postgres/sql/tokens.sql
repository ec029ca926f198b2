-- name: insert_token
-- A new API token: its digest, never its secret. Nothing when a live token has the name.
INSERT INTO qinglong.api_tokens (token_id, name, digest, scope, projects, created_at_ms, expires_at_ms)
VALUES (%(token_id)s, %(name)s, %(digest)s, %(scope)s, %(projects)s, %(created)s, %(expires)s)
ON CONFLICT (name) WHERE revoked_at_ms IS NULL DO NOTHING
RETURNING token_id

-- name: revoke_token
-- Revoke the live token of this name: it fails from its next request on.
UPDATE qinglong.api_tokens SET revoked_at_ms = %(now)s
 WHERE name = %(name)s AND revoked_at_ms IS NULL
RETURNING token_id, name, scope, projects, created_at_ms, expires_at_ms, revoked_at_ms

-- name: list_tokens
-- Every token, newest first (revoked ones too, with the time they were revoked).
SELECT token_id, name, scope, projects, created_at_ms, expires_at_ms, revoked_at_ms
  FROM qinglong.api_tokens ORDER BY created_at_ms DESC, token_id

-- name: token_by_digest
-- The token whose secret hashes to this digest, read on every API request.
SELECT token_id, name, scope, projects, created_at_ms, expires_at_ms, revoked_at_ms
  FROM qinglong.api_tokens WHERE digest = %(digest)s

-- name: insert_audit
-- One audit entry, written in the transaction of its change.
INSERT INTO qinglong.audit_log (at_ms, actor, token_id, source, action, object, result, detail)
VALUES (%(at)s, %(actor)s, %(token_id)s, %(source)s, %(action)s, %(object)s, %(result)s, %(detail)s)

-- name: list_audit
-- Audit entries at or after a time, newest first.
SELECT entry_id, at_ms, actor, token_id, source, action, object, result, detail
  FROM qinglong.audit_log WHERE at_ms >= %(since)s ORDER BY at_ms DESC, entry_id DESC LIMIT %(limit)s

-- name: insert_console_link
-- A console sign-in link: its code's digest, never the code.
INSERT INTO qinglong.console_links (link_id, digest, created_at_ms, expires_at_ms)
VALUES (%(link_id)s, %(digest)s, %(created)s, %(expires)s)

-- name: use_console_link
-- Use a link once, before it expires: the link's id, or no row.
UPDATE qinglong.console_links SET used_at_ms = %(now)s
 WHERE digest = %(digest)s AND used_at_ms IS NULL AND expires_at_ms > %(now)s
RETURNING link_id

-- name: console_link_by_digest
-- Why a link could not be used (used or expired); no row: no such link.
SELECT link_id, expires_at_ms, used_at_ms FROM qinglong.console_links WHERE digest = %(digest)s

-- name: prune_console_links
-- Links expired before a time (used or not): nothing can redeem them any more.
DELETE FROM qinglong.console_links WHERE expires_at_ms < %(before)s
