-- The deliverer's claim (pending -> leased) and outcome (leased ->
-- accepted) become heap-only (HOT) updates: the new row version stays on
-- its page and no index gets a new entry.
--
-- Before: six partial indexes of outbox_items named `state` in their
-- predicate (pending_due, leased_expiry, open_created, accepted,
-- uncertain, quarantined). Postgres makes an update heap-only only when no
-- column an index reads (key or predicate) changes value, so every claim
-- and every outcome wrote a row version on another page and an entry in
-- every index the row matched: the primary key, the 100-byte identity key
-- (with its uniqueness check) and two partial indexes — about a fifth of
-- Postgres's CPU an item in the demo. Dropping the six indexes alone made
-- 96 % of the item updates heap-only (fillfactor 50, set by 00308) and the
-- stream demo 1.16x faster at 0.83x Postgres CPU.
--
-- After, every reader those indexes served keeps an index that no claim
-- and no outcome moves:
-- * outbox_undecided: one row per item that is pending or leased (the
--   items JetStream or the relay still owe an outcome). Triggers add the
--   row when an item is staged in, or moves back into, pending or leased;
--   nothing on the delivery path deletes it. The relay's re-dispatch sweep
--   deletes the rows of items that left (relay/sweep.go), so the table is
--   a superset of the undecided items by at most one sweep interval of
--   outcomes. Its readers: the sweep, the gauges' pending and leased
--   figures (the oldest by outbox_undecided_created_idx, a copy of the
--   item's created_at), the demo's drain check.
--   `generation` counts the item's entries while the row exists: the sweep
--   deletes a row only at the generation it read, so an item that moves
--   back into pending while the sweep deletes its row keeps it (the
--   trigger's upsert bumps the generation; the delete's recheck then
--   fails).
-- * finished (stored, generated from state): true once nothing automatic
--   moves the item again (confirmed, rejected, quarantined). Claims and
--   accepted outcomes leave it false, so its index does not block HOT.
--   outbox_items_unfinished_created_idx (created_at) WHERE NOT finished
--   serves the accepted-age gauge and the reconciler's unconfirmed scan
--   (accepted rows wait there until the reconciler confirms them).
-- * uncertain_since (stored, generated): updated_at while the item is
--   uncertain, else NULL; outbox_items_uncertain_since_idx serves the
--   uncertain gauges. Only entering or leaving uncertain moves it.
-- * outbox_items_quarantine_reason_idx (quarantine_reason) WHERE
--   quarantine_reason IS NOT NULL: the reason is set exactly while the item
--   is quarantined (CHECK outbox_items_quarantine_reason); the gauges count
--   by it.
--
-- Adding the two stored generated columns rewrites outbox_items under an
-- ACCESS EXCLUSIVE lock (every row, at fillfactor 50): on a large table,
-- run this migration in a maintenance window with the services stopped.

-- +goose Up
-- No item may be staged or moved between the backfill below and the
-- triggers that take over from it (the ALTER TABLE further down locks the
-- table anyway, but only after the backfill has read it).
LOCK TABLE outbox_items IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE outbox_undecided (
    item_id    bigint PRIMARY KEY, -- outbox_items.id (no foreign key: the check would lock the item row on every staging)
    created_at timestamptz NOT NULL, -- the item's created_at (immutable), for the age gauges
    generation integer NOT NULL DEFAULT 1
) WITH (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_analyze_scale_factor = 0.05
);

CREATE INDEX outbox_undecided_created_idx ON outbox_undecided (created_at);

INSERT INTO outbox_undecided (item_id, created_at)
SELECT id, created_at FROM outbox_items WHERE state IN ('pending', 'leased');

-- Staged rows: the publish queue's statement trigger (00308) also records
-- the undecided ones, in the same pass over the inserted rows.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_publish_enqueue_inserted() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO outbox_publish_queue (item_id, dispatch, due_at)
    SELECT id, dispatch, CASE WHEN state = 'leased' THEN lease_expires_at ELSE next_attempt_at END
    FROM inserted_items
    WHERE state IN ('pending', 'leased') AND published_dispatch < dispatch;
    INSERT INTO outbox_undecided (item_id, created_at)
    SELECT id, created_at FROM inserted_items WHERE state IN ('pending', 'leased');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- An item that moves back into pending or leased (an operator's requeue, a
-- recall of an uncertain item): the WHEN clause is evaluated without
-- calling the function, so claims, retries and outcomes never call it.
-- +goose StatementBegin
CREATE FUNCTION outbox_undecided_reentered() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO outbox_undecided (item_id, created_at) VALUES (NEW.id, NEW.created_at)
    ON CONFLICT (item_id) DO UPDATE SET generation = outbox_undecided.generation + 1;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_items_undecided_reentered AFTER UPDATE OF state ON outbox_items
    FOR EACH ROW
    WHEN (OLD.state NOT IN ('pending', 'leased') AND NEW.state IN ('pending', 'leased'))
    EXECUTE FUNCTION outbox_undecided_reentered();

ALTER TABLE outbox_items
    ADD COLUMN finished boolean NOT NULL
        GENERATED ALWAYS AS (state IN ('confirmed', 'rejected', 'quarantined')) STORED,
    ADD COLUMN uncertain_since timestamptz
        GENERATED ALWAYS AS (CASE WHEN state = 'uncertain' THEN updated_at END) STORED;

DROP INDEX outbox_items_accepted_idx;
DROP INDEX outbox_items_leased_expiry_idx;
DROP INDEX IF EXISTS outbox_items_open_created_idx;
DROP INDEX outbox_items_pending_due_idx;
DROP INDEX outbox_items_quarantined_idx;
DROP INDEX outbox_items_uncertain_idx;

CREATE INDEX outbox_items_unfinished_created_idx ON outbox_items (created_at) WHERE NOT finished;
CREATE INDEX outbox_items_uncertain_since_idx ON outbox_items (uncertain_since) WHERE uncertain_since IS NOT NULL;
CREATE INDEX outbox_items_quarantine_reason_idx ON outbox_items (quarantine_reason) WHERE quarantine_reason IS NOT NULL;

-- +goose Down
DROP INDEX outbox_items_quarantine_reason_idx;
DROP INDEX outbox_items_uncertain_since_idx;
DROP INDEX outbox_items_unfinished_created_idx;
ALTER TABLE outbox_items DROP COLUMN uncertain_since, DROP COLUMN finished;

CREATE INDEX outbox_items_pending_due_idx ON outbox_items (next_attempt_at) WHERE state = 'pending';
CREATE INDEX outbox_items_leased_expiry_idx ON outbox_items (lease_expires_at) WHERE state = 'leased';
CREATE INDEX outbox_items_uncertain_idx ON outbox_items (updated_at) WHERE state = 'uncertain';
CREATE INDEX outbox_items_quarantined_idx ON outbox_items (quarantine_reason, updated_at) WHERE state = 'quarantined';
CREATE INDEX outbox_items_accepted_idx ON outbox_items (occurred_at) WHERE state = 'accepted';
CREATE INDEX outbox_items_open_created_idx ON outbox_items (state, created_at)
    WHERE state IN ('pending', 'leased', 'accepted');

DROP TRIGGER outbox_items_undecided_reentered ON outbox_items;
DROP FUNCTION outbox_undecided_reentered();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_publish_enqueue_inserted() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO outbox_publish_queue (item_id, dispatch, due_at)
    SELECT id, dispatch, CASE WHEN state = 'leased' THEN lease_expires_at ELSE next_attempt_at END
    FROM inserted_items
    WHERE state IN ('pending', 'leased') AND published_dispatch < dispatch;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TABLE outbox_undecided;
