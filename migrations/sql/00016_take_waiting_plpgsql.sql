-- aurora_take_waiting in PL/pgSQL instead of SQL.
--
-- A SQL-language function that cannot be inlined (this one deletes) has its
-- body parsed and planned again for every statement that calls it; the
-- deliverers' outcome write (recordSQL) calls it for every slot it frees. A
-- perf profile of the demo put that parse-and-plan at 3.7 % of the machine's
-- CPU (fmgr_sql). PL/pgSQL keeps the plan for the session. Same contract:
-- VOLATILE, so each call reads with a fresh snapshot (READ COMMITTED) and
-- sees a hand-off that committed while the caller waited for the slot's lock
-- (migration 00015).

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION aurora_take_waiting(acct text, cust text, meter text, lim integer) RETURNS bytea[]
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

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION aurora_take_waiting(acct text, cust text, meter text, lim integer) RETURNS bytea[]
LANGUAGE sql VOLATILE AS $$
    WITH taken AS (
        DELETE FROM delivery_slot_waiting
        WHERE ctid IN (
            SELECT ctid FROM delivery_slot_waiting
            WHERE destination_account = acct AND stripe_customer = cust AND meter_id = meter
            ORDER BY seq
            LIMIT lim
        )
        RETURNING message, seq
    )
    SELECT coalesce(array_agg(message ORDER BY seq), '{}') FROM taken
$$;
-- +goose StatementEnd
