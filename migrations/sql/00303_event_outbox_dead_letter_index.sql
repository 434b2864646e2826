-- The domain events' dead letters, read by the gauges (aurora gauges,
-- auroractl status) at every scrape: a partial index whose size is the
-- figure itself, near empty when healthy, so the count never reads the
-- event outbox.

-- +goose Up
CREATE INDEX event_outbox_dead ON event_outbox (dead_lettered_at)
    WHERE status = 'dead_letter';

-- +goose Down
DROP INDEX event_outbox_dead;
