-- The relay finds the dispatches it must publish in a narrow queue table,
-- not through an index on the wide outbox row, so that its mark on the row
-- (published_dispatch, published_at) is a heap-only (HOT) update.
--
-- Before: the relay locked each due row FOR UPDATE (one heap lock record a
-- row), published it, then set published_dispatch. Because
-- published_dispatch was in the predicate of outbox_items_unpublished_idx
-- and the update trigger moved updated_at (a column of the quarantined and
-- uncertain indexes), every mark was a non-HOT update: a new row version on
-- another page and a new entry in every index the row matched (the
-- 100-byte identity key among them). That was a fifth of Postgres's time
-- per item in the demo.
--
-- After:
-- * outbox_publish_queue holds one row per (item, dispatch) waiting to be
--   published: a wake-up call with the earliest time it may be due. Rows
--   are written by triggers only, so every path that stages an item or
--   moves its dispatch (staging, the SQL API, retries, deferrals, recalls,
--   the relay's sweep, operators' requeues) feeds it without knowing it.
-- * The relay takes due queue rows (DELETE ... FOR UPDATE SKIP LOCKED, in
--   its batch transaction), re-reads each item, publishes what is still
--   unpublished and due, marks it, and puts back what is due later; a
--   rolled-back batch puts everything back.
-- * The mark no longer moves updated_at (it is not a change of the item's
--   state; published_at records it), and outbox_items_unpublished_idx is
--   dropped: no index reads published_dispatch or moves with the mark.
--
-- The trigger functions run as their owner (SECURITY DEFINER, a fixed
-- search_path): a role allowed to stage into outbox_items needs no grant on
-- the queue.
--
-- The queue has no primary key on purpose: a row is a wake-up call, two
-- for the same dispatch are harmless (JetStream drops the second copy by
-- its message id), and the relay deletes the rows it took by their
-- physical address while it holds them locked.

-- +goose Up
CREATE TABLE outbox_publish_queue (
    item_id  bigint NOT NULL,   -- outbox_items.id (no foreign key: rows of items are never deleted, and the check would lock the item)
    dispatch integer NOT NULL,  -- the dispatch to publish
    due_at   timestamptz NOT NULL -- not before: next_attempt_at (pending) or lease_expires_at (leased) when queued
) WITH (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_analyze_scale_factor = 0.05
);

CREATE INDEX outbox_publish_queue_due_idx ON outbox_publish_queue (due_at);

INSERT INTO outbox_publish_queue (item_id, dispatch, due_at)
SELECT id, dispatch, CASE WHEN state = 'leased' THEN lease_expires_at ELSE next_attempt_at END
FROM outbox_items
WHERE state IN ('pending', 'leased') AND published_dispatch < dispatch;

-- Staged rows: one INSERT ... SELECT per statement over the rows it
-- inserted (a transition table), not a function call per row.
-- +goose StatementBegin
CREATE FUNCTION outbox_publish_enqueue_inserted() RETURNS trigger LANGUAGE plpgsql
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

CREATE TRIGGER outbox_items_enqueue_inserted AFTER INSERT ON outbox_items
    REFERENCING NEW TABLE AS inserted_items
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_publish_enqueue_inserted();

-- A new dispatch (retry, deferral, sweep, requeue), an unpublished one
-- brought forward (recall), or an unpublished one that re-enters pending or
-- leased from any other state (no path does that without a new dispatch
-- today; the trigger keeps a future one from stranding the item). The WHEN
-- clause is evaluated without calling the function: claims (pending to
-- leased) and terminal outcomes never call it.
-- +goose StatementBegin
CREATE FUNCTION outbox_publish_enqueue_moved() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO outbox_publish_queue (item_id, dispatch, due_at)
    VALUES (NEW.id, NEW.dispatch, CASE WHEN NEW.state = 'leased' THEN NEW.lease_expires_at ELSE NEW.next_attempt_at END);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_items_enqueue_moved AFTER UPDATE OF dispatch, next_attempt_at, state ON outbox_items
    FOR EACH ROW
    WHEN (NEW.state IN ('pending', 'leased') AND NEW.published_dispatch < NEW.dispatch
          AND (NEW.dispatch <> OLD.dispatch OR NEW.next_attempt_at < OLD.next_attempt_at
               OR OLD.state NOT IN ('pending', 'leased')))
    EXECUTE FUNCTION outbox_publish_enqueue_moved();

-- The relay's mark keeps updated_at: only published_dispatch and
-- published_at move, so the update can stay on its page without new index
-- entries. Every other update still sets updated_at = now().
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_items_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.tenant, NEW.subject_kind, NEW.subject_ref, NEW.exporter, NEW.destination_account, NEW.mode,
        NEW.mapping_version, NEW.idempotency_key, NEW.feature, NEW.quantity, NEW.occurred_at, NEW.period_start, NEW.payload)
       IS DISTINCT FROM
       (OLD.tenant, OLD.subject_kind, OLD.subject_ref, OLD.exporter, OLD.destination_account, OLD.mode,
        OLD.mapping_version, OLD.idempotency_key, OLD.feature, OLD.quantity, OLD.occurred_at, OLD.period_start, OLD.payload)
    THEN
        RAISE EXCEPTION 'outbox_items % identity and payload are immutable', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.published_dispatch IS DISTINCT FROM OLD.published_dispatch
       AND (NEW.state, NEW.dispatch, NEW.lease_token, NEW.next_attempt_at, NEW.attempts)
           IS NOT DISTINCT FROM (OLD.state, OLD.dispatch, OLD.lease_token, OLD.next_attempt_at, OLD.attempts)
    THEN
        NEW.updated_at := OLD.updated_at;
    ELSE
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

DROP INDEX outbox_items_unpublished_idx;
ALTER TABLE outbox_items SET (fillfactor = 50);

-- +goose Down
CREATE INDEX outbox_items_unpublished_idx ON outbox_items (next_attempt_at)
    WHERE state IN ('pending', 'leased') AND published_dispatch < dispatch;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_items_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.tenant, NEW.subject_kind, NEW.subject_ref, NEW.exporter, NEW.destination_account, NEW.mode,
        NEW.mapping_version, NEW.idempotency_key, NEW.feature, NEW.quantity, NEW.occurred_at, NEW.period_start, NEW.payload)
       IS DISTINCT FROM
       (OLD.tenant, OLD.subject_kind, OLD.subject_ref, OLD.exporter, OLD.destination_account, OLD.mode,
        OLD.mapping_version, OLD.idempotency_key, OLD.feature, OLD.quantity, OLD.occurred_at, OLD.period_start, OLD.payload)
    THEN
        RAISE EXCEPTION 'outbox_items % identity and payload are immutable', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;
-- +goose StatementEnd

DROP TRIGGER outbox_items_enqueue_moved ON outbox_items;
DROP FUNCTION outbox_publish_enqueue_moved();
DROP TRIGGER outbox_items_enqueue_inserted ON outbox_items;
DROP FUNCTION outbox_publish_enqueue_inserted();
DROP TABLE outbox_publish_queue;
