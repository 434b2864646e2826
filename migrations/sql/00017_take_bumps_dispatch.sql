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
-- still open at the handed dispatch to dispatch + 1: a pending item also
-- gets next_attempt_at = at + lease, so the relay publishes the new
-- generation once it is due unless the taker claims it first (a handed
-- claim may take a pending item before its next_attempt_at: it names the
-- exact new dispatch, which no one else has); a leased item whose lease has
-- expired (its holder died; the message that came back was handed over)
-- keeps its expired lease and is published by the relay at once, as any
-- expired lease with an unpublished dispatch is, while the taker claims it.
-- It returns the messages with the new dispatch. Entries whose item has
-- moved on (delivered, leased by a live holder, re-dispatched meanwhile)
-- are dropped from the list: another message or lease owns them.
--
-- The items are locked FOR NO KEY UPDATE SKIP LOCKED: the caller (the
-- outcome write) holds the slot's lock, and a claim holding an item's lock
-- may be waiting for that slot, so waiting here could deadlock. NO KEY: the
-- key-share locks of foreign-key checks (an attempt, usage event or
-- recovery action naming the item) do not make the take skip it. An entry
-- whose item someone else has locked stays in the list for the slot's next
-- take: the lockers that matter — a claim, the relay, the sweep — decide
-- the item meanwhile (lease it, publish it, re-dispatch it), and a take
-- after that drops the entry. An entry skipped for another reason (an
-- operator's refused action holding the row) whose slot sees no further
-- take is taken by the relay's sweep, with this function at a lease of
-- zero, once no live holder is left on the slot (relay/sweep.go).
--
-- skip names the items the calling outcome write records: their entries
-- (a handed copy of an item being recorded) are dropped, never taken — the
-- write's own update of those rows and an update here must not meet in one
-- statement. An entry whose item does not exist is dropped too.
--
-- The waiting rows carry the item and dispatch in columns (the message is
-- the same JSON the deliverer decodes); rows written by an older deliverer
-- have them only in the message, read from there.
--
-- aurora_take_waiting stays for deliverers not yet upgraded (their handed
-- claim still bumps the dispatch itself); a later migration drops it. While
-- old and new deliverers run side by side, an item a new one hands to an old
-- holder can wait up to one lease (the old claim does not take an item
-- before its next_attempt_at): upgrade the deliverers together when that
-- matters.

-- +goose Up
ALTER TABLE delivery_slot_waiting ADD COLUMN item_id bigint, ADD COLUMN dispatch integer;

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

-- +goose Down
DROP FUNCTION aurora_take_handed(text, text, text, integer, interval, timestamptz, bigint[]);
ALTER TABLE delivery_slot_waiting DROP COLUMN item_id, DROP COLUMN dispatch;
