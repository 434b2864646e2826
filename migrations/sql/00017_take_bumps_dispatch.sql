-- Taking handed-off messages gives their items a new dispatch, due one lease
-- later: a taker that dies before claiming them no longer leaves them to the
-- re-dispatch sweep.
--
-- Until now the holder of a delivery slot took the messages left for it
-- (migration 00015) by deleting them, and gave each item a new dispatch only
-- when it claimed it. A holder killed between the two (its outcome write
-- committed the take; its next claim never ran) left the items pending and
-- published for a dispatch whose message the loser had already acked: only
-- the relay's re-dispatch sweep (AURORA_RELAY_REDISPATCH_SECONDS, 300 s by
-- default) brought them back — 48 of 2,946 handed items in a kill trial
-- (docs/deliverer.md).
--
-- aurora_take_handed takes them and, in the same statement, moves each item
-- still pending at the handed dispatch to dispatch + 1 with next_attempt_at =
-- at + lease: a new generation the relay publishes once it is due, unless
-- the taker claims it first (a handed claim may take a pending item before
-- its next_attempt_at: it names the exact new dispatch, which no one else
-- has). Items no longer pending at that dispatch (delivered, leased by
-- someone else, re-dispatched meanwhile) are dropped from the list: another
-- message or lease owns them. It returns the messages with the new dispatch.
--
-- The waiting rows carry the item and dispatch in columns (the message is
-- the same JSON the deliverer decodes); rows written by an older deliverer
-- have them only in the message, read from there.
--
-- aurora_take_waiting stays for deliverers not yet upgraded (their handed
-- claim still bumps the dispatch itself); a later migration drops it.

-- +goose Up
ALTER TABLE delivery_slot_waiting ADD COLUMN item_id bigint, ADD COLUMN dispatch integer;

-- +goose StatementBegin
CREATE FUNCTION aurora_take_handed(acct text, cust text, meter text, lim integer, lease interval, at timestamptz)
RETURNS bytea[] LANGUAGE plpgsql VOLATILE AS $$
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
        RETURNING seq, convert_from(message, 'UTF8')::jsonb AS body,
                  coalesce(item_id, (convert_from(message, 'UTF8')::jsonb ->> 'item_id')::bigint) AS item_id,
                  coalesce(dispatch, (convert_from(message, 'UTF8')::jsonb ->> 'dispatch')::integer) AS dispatch
    ), bumped AS (
        UPDATE outbox_items o SET dispatch = o.dispatch + 1, next_attempt_at = at + lease
        FROM t
        WHERE o.id = t.item_id AND o.dispatch = t.dispatch AND o.state = 'pending'
        RETURNING o.id, o.dispatch
    )
    SELECT coalesce(array_agg(convert_to(jsonb_set(t.body, '{dispatch}', to_jsonb(b.dispatch))::text, 'UTF8') ORDER BY t.seq), '{}')
    INTO taken
    FROM t JOIN bumped b ON b.id = t.item_id AND b.dispatch = t.dispatch + 1;
    RETURN taken;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION aurora_take_handed(text, text, text, integer, interval, timestamptz);
ALTER TABLE delivery_slot_waiting DROP COLUMN item_id, DROP COLUMN dispatch;
