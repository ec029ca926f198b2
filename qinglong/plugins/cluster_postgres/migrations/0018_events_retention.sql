-- capability: 16
-- The events out do not grow without bound: the delivery loop deletes, in bounded batches,
-- routed events older than [notifications] retention_days whose deliveries all ended, with
-- those deliveries (a pending delivery keeps its event).
GRANT DELETE ON qinglong.event_outbox, qinglong.event_deliveries TO {{runtime}};
