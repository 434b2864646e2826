-- One unique index for the identity instead of two indexes.
--
-- The seven-part identity was unique through a seven-column text index, and
-- lookups by the idempotency key (the identifier Stripe knows) had a second
-- index. Every state change of an item is a non-HOT update (the partial
-- indexes name `state`), so every claim, outcome and relay mark wrote a new
-- entry into both: 8 of an item's 16 index insertions, on the widest keys.
--
-- The idempotency key is the SHA-256 of four of the seven parts (tenant,
-- subject_kind, subject_ref, destination_account; length-prefixed, so
-- unambiguous), computed by the insert trigger. (key, exporter, mode,
-- mapping_version) is therefore unique exactly when the identity is (short of
-- a SHA-256 collision), and its index serves lookups by key as well. The
-- constraint keeps its name, so ON CONFLICT ON CONSTRAINT
-- outbox_items_identity_key is unchanged. Lookups by the seven parts add
-- `idempotency_key = aurora_idempotency_key(...)` to use it.

-- +goose Up
ALTER TABLE outbox_items DROP CONSTRAINT outbox_items_identity_key;
DROP INDEX outbox_items_key_idx;
ALTER TABLE outbox_items ADD CONSTRAINT outbox_items_identity_key
    UNIQUE (idempotency_key, exporter, mode, mapping_version);

-- +goose Down
ALTER TABLE outbox_items DROP CONSTRAINT outbox_items_identity_key;
ALTER TABLE outbox_items ADD CONSTRAINT outbox_items_identity_key
    UNIQUE (tenant, subject_kind, subject_ref, exporter, destination_account, mode, mapping_version);
CREATE INDEX outbox_items_key_idx ON outbox_items (idempotency_key);
