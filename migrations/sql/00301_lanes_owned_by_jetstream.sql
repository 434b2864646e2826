-- Lanes are owned through JetStream, not coordinated in Postgres.
--
-- One call at a time per (destination account, Stripe customer, meter) was
-- kept by delivery slots (00010), a hand-off list between deliverers
-- (00015-00017) and two take functions, one called from the deliverers'
-- outcome write and one from the relay's sweep. The relay now publishes each
-- lane on one partition of AURORA_OUTBOX and each partition is consumed by
-- one deliverer at a time (a priority group with the pinned-client policy),
-- which runs a lane's items one at a time: the rule is kept inside one
-- process, and the lease_token fence still decides whose outcome is written.
-- This drops the slots, the hand-off list and both functions.
--
-- Upgrade: old and new deliverers must not run at once (old ones take slots
-- the new ones no longer look at, and new ones do not hand off). Drain the
-- old deliverers first (scale them to zero and wait for them to exit: a
-- graceful stop finishes or cancels in-flight calls within
-- AURORA_DELIVERER_SHUTDOWN_SECONDS), stop the old relay, apply this
-- migration, then start the new relay and deliverers. Items are never lost
-- meanwhile: they stay pending in outbox_items, and items the old processes
-- held leased or handed off are published again when their lease expires or
-- by the relay's re-dispatch sweep (docs/deliverer.md, "Upgrading").

-- +goose Up
DROP FUNCTION IF EXISTS aurora_take_handed(text, text, text, integer, interval, timestamptz, bigint[]);
DROP FUNCTION IF EXISTS aurora_take_waiting(text, text, text, integer);
DROP TABLE IF EXISTS delivery_slot_waiting;
DROP TABLE IF EXISTS delivery_slots;

-- +goose Down
-- The objects as 00017 left them, empty (they only ever held hints).
CREATE UNLOGGED TABLE delivery_slots (
    destination_account text NOT NULL,
    stripe_customer     text NOT NULL,
    meter_id            text NOT NULL,
    item_id             bigint,
    lease_token         bigint NOT NULL DEFAULT 0,
    expires_at          timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (destination_account, stripe_customer, meter_id)
) WITH (fillfactor = 70);
CREATE UNLOGGED TABLE delivery_slot_waiting (
    seq                 bigint GENERATED ALWAYS AS IDENTITY,
    destination_account text NOT NULL,
    stripe_customer     text NOT NULL,
    meter_id            text NOT NULL,
    message             bytea NOT NULL,
    handed_at           timestamptz NOT NULL DEFAULT now(),
    item_id             bigint,
    dispatch            integer
);
CREATE INDEX delivery_slot_waiting_slot_idx ON delivery_slot_waiting (destination_account, stripe_customer, meter_id);
-- +goose StatementBegin
CREATE FUNCTION aurora_take_waiting(acct text, cust text, meter text, lim integer) RETURNS bytea[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    taken bytea[];
BEGIN
    WITH t AS (
        DELETE FROM delivery_slot_waiting
        WHERE ctid IN (
            SELECT ctid FROM delivery_slot_waiting
            WHERE destination_account = acct AND stripe_customer = cust AND meter_id = meter
            ORDER BY seq
            LIMIT lim
        )
        RETURNING message, seq
    )
    SELECT coalesce(array_agg(message ORDER BY seq), '{}') INTO taken FROM t;
    RETURN taken;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION aurora_take_handed(acct text, cust text, meter text, lim integer, lease interval, at timestamptz, skip bigint[])
RETURNS bytea[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    taken bytea[];
BEGIN
    WITH w AS MATERIALIZED (
        SELECT ctid AS wtid, seq, message,
               coalesce(item_id, (convert_from(message, 'UTF8')::jsonb ->> 'item_id')::bigint) AS item_id,
               coalesce(dispatch, (convert_from(message, 'UTF8')::jsonb ->> 'dispatch')::integer) AS dispatch
        FROM delivery_slot_waiting
        WHERE destination_account = acct AND stripe_customer = cust AND meter_id = meter
        ORDER BY seq
        LIMIT lim
    ), locked AS MATERIALIZED (
        -- One primary-key lookup per item (LATERAL); SKIP LOCKED: see above.
        -- A row another transaction changed since this statement's snapshot
        -- is locked and read at its latest version.
        SELECT o.id, o.dispatch, o.state, o.lease_expires_at
        FROM (SELECT DISTINCT item_id FROM w) x
        CROSS JOIN LATERAL (
            SELECT o.id, o.dispatch, o.state, o.lease_expires_at FROM outbox_items o
            WHERE o.id = x.item_id
            FOR NO KEY UPDATE SKIP LOCKED
        ) o
    ), eligible AS MATERIALIZED (
        SELECT l.id FROM locked l
        WHERE (l.state = 'pending' OR (l.state = 'leased' AND l.lease_expires_at < at))
          AND l.id <> ALL (coalesce(skip, '{}'))
          AND EXISTS (SELECT 1 FROM w WHERE w.item_id = l.id AND w.dispatch = l.dispatch)
    ), bumped AS (
        -- By id, not by the locked row's address: an UPDATE reaches the
        -- latest version of a row it holds the lock of.
        UPDATE outbox_items o
        SET dispatch = o.dispatch + 1,
            next_attempt_at = CASE WHEN o.state = 'pending' THEN at + lease ELSE o.next_attempt_at END
        WHERE o.id = ANY (ARRAY(SELECT id FROM eligible))
        RETURNING o.id, o.dispatch
    ), gone AS (
        -- Taken (bumped), moved on (locked here, not eligible) or naming
        -- no item: off the list.
        DELETE FROM delivery_slot_waiting d
        WHERE d.ctid = ANY (ARRAY(
            SELECT w.wtid FROM w
            WHERE w.item_id IN (SELECT id FROM locked)
               OR NOT EXISTS (SELECT 1 FROM outbox_items o WHERE o.id = w.item_id)))
    )
    SELECT coalesce(array_agg(convert_to(jsonb_set(convert_from(w.message, 'UTF8')::jsonb, '{dispatch}', to_jsonb(b.dispatch))::text, 'UTF8')
                              ORDER BY w.seq), '{}')
    INTO taken
    FROM w JOIN bumped b ON b.id = w.item_id AND b.dispatch = w.dispatch + 1;
    RETURN taken;
END
$$;
-- +goose StatementEnd
