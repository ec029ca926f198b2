-- 0016_console_links: one-time console sign-in links made on the host (`qinglong console link`):
-- only the SHA-256 of each code, never the code. A link is used at most once (used_at_ms set in
-- the transaction that signs a browser in, with its audit entry) and not after expires_at_ms.
CREATE TABLE console_links (
    link_id       TEXT PRIMARY KEY,
    digest        TEXT NOT NULL UNIQUE,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    used_at_ms    INTEGER
);
CREATE INDEX console_links_by_expiry ON console_links (expires_at_ms);
