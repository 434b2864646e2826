-- The operations gauges read the oldest item of each state that something
-- automatic still moves (pending, leased, accepted) by when it was staged.
-- Without this index that read scans every row of the state (accepted rows
-- accumulate until the reconciler confirms them); with it each state's
-- oldest row is one index probe, whatever the table's size.
--
-- Built CONCURRENTLY so a large outbox_items keeps taking writes while the
-- index builds; goose therefore runs this file outside a transaction.

-- +goose NO TRANSACTION

-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_items_open_created_idx
    ON outbox_items (state, created_at)
    WHERE state IN ('pending', 'leased', 'accepted');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_items_open_created_idx;
