-- capability: 2
-- The runtime writes only the cursor and claim columns of a schedule: its cursor (next and last
-- occurrence), the four-part claim fence (owner, token, claim version, expiry), the state version
-- and the acquisition time. It can no longer move a schedule to another trigger, project or
-- revision, nor rewrite its publish time. Readiness compares the catalog with
-- roles.EXPECTED_COLUMN_GRANTS and the shipped fingerprint, so a change here must change both
-- (regenerate the fingerprint: python tests/cluster/regenerate_fingerprint.py).

-- Revoking the table-level UPDATE also revokes every column-level UPDATE of the role.
REVOKE UPDATE ON qinglong.trigger_schedules FROM {{runtime}};
GRANT UPDATE (next_fire_at_ms, last_scheduled_at_ms, state_version, claim_owner, claim_token,
              claim_version, claim_expires_at_ms, updated_at_ms)
    ON qinglong.trigger_schedules TO {{runtime}};
