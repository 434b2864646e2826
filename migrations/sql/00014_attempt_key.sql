-- An attempt is identified by its item and the lease it ran under.
--
-- outbox_attempts had two unique indexes: the identity column's primary key
-- and (item_id, lease_token), which every writer already uses (ON CONFLICT,
-- the takeover's stale_lease row, recordSQL's fill-in). Every attempt paid
-- for both: an index insertion and a WAL record per delivered item that
-- nothing reads (ids are only a tie-break when listing an item's attempts).
-- (item_id, lease_token) becomes the primary key; id stays, unindexed, as a
-- creation-order tie-break.

-- +goose Up
ALTER TABLE outbox_attempts DROP CONSTRAINT outbox_attempts_pkey;
ALTER TABLE outbox_attempts DROP CONSTRAINT outbox_attempts_item_id_lease_token_key;
ALTER TABLE outbox_attempts ADD CONSTRAINT outbox_attempts_pkey PRIMARY KEY (item_id, lease_token);

-- +goose Down
ALTER TABLE outbox_attempts DROP CONSTRAINT outbox_attempts_pkey;
ALTER TABLE outbox_attempts ADD CONSTRAINT outbox_attempts_item_id_lease_token_key UNIQUE (item_id, lease_token);
ALTER TABLE outbox_attempts ADD PRIMARY KEY (id);
