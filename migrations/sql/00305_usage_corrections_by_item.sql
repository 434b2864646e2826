-- The reconciler's ledger joins each outbox item to the correction that
-- staged it (usage_events.kind = 'correction', by item_id). Without an index
-- on item_id, a planner working from missing statistics (a table loaded
-- since its last ANALYZE: every backfill, every demo) chose a nested loop
-- with a sequential scan of usage_events per outbox item, and one run over
-- 19,331 items took minutes. A partial index of the corrections alone (few,
-- when any) makes that join one probe per item whatever the statistics say.

-- +goose Up
CREATE INDEX usage_events_correction_item ON usage_events (item_id)
    WHERE kind = 'correction';

-- +goose Down
DROP INDEX usage_events_correction_item;
