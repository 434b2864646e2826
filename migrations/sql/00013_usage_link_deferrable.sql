-- A usage event can be inserted already linked to the item staged for it.
--
-- Usage.RecordBatch stored events, then staged their items, then linked each
-- event to its item with an UPDATE: per demo item 14 buffer hits and 4 WAL
-- records (pg_stat_statements), a tenth of the pipeline's database work. It
-- now takes the items' ids from the identity sequence first and inserts
-- events and items with them in one statement. When an identity already has
-- an item (staged by hand), the item insert does nothing and the event must
-- point at the existing item instead: RecordBatch repairs that link in the
-- same transaction, so it defers this check to the commit
-- (SET CONSTRAINTS ... DEFERRED). Everyone else keeps it immediate.

-- +goose Up
ALTER TABLE usage_events ALTER CONSTRAINT usage_events_item_id_fkey DEFERRABLE INITIALLY IMMEDIATE;

-- +goose Down
ALTER TABLE usage_events ALTER CONSTRAINT usage_events_item_id_fkey NOT DEFERRABLE;
