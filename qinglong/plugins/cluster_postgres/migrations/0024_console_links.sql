-- capability: 22
-- One-time console sign-in links made on the host (`qinglong console link`): only the SHA-256 of
-- each code, never the code. A link is used at most once (used_at_ms set in the transaction that
-- signs a browser in, with its audit entry) and not after expires_at_ms. Like the tokens, only
-- the admin role (the `qinglong api` process and the host's CLI) reads and writes it.
CREATE TABLE qinglong.console_links (
    link_id       text PRIMARY KEY,
    digest        text NOT NULL UNIQUE,
    created_at_ms bigint NOT NULL,
    expires_at_ms bigint NOT NULL,
    used_at_ms    bigint
);
CREATE INDEX console_links_by_expiry ON qinglong.console_links (expires_at_ms);

REVOKE ALL ON qinglong.console_links FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON qinglong.console_links TO {{admin}};
