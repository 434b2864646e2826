-- Delivery slots: at most one in-flight provider call per
-- (destination account, Stripe customer, meter) across every deliverer
-- (Stripe live mode allows one concurrent call per customer per meter;
-- FACTS.md). A deliverer takes the slot in the same statement that claims an
-- item and gives it back in the same statement that records the outcome, so
-- the slot costs no extra round trip and pins no connection during the call.
--
-- A slot is held by (item_id, lease_token) until expires_at, which equals the
-- item's lease_expires_at: a holder that dies frees the slot when its lease
-- would have expired. A free slot has item_id NULL and expires_at -infinity.
--
-- UNLOGGED: a slot is a liveness hint, never a correctness fact (fencing is
-- lease_token on outbox_items). After a Postgres crash the table is empty,
-- which at worst lets calls that were in flight at the crash overlap once
-- (Stripe answers 429, which is retried with the same key).

-- +goose Up
CREATE UNLOGGED TABLE delivery_slots (
    destination_account text NOT NULL,
    stripe_customer     text NOT NULL,
    meter_id            text NOT NULL,
    item_id             bigint,
    lease_token         bigint NOT NULL DEFAULT 0,
    expires_at          timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (destination_account, stripe_customer, meter_id)
) WITH (fillfactor = 70);

-- +goose Down
DROP TABLE delivery_slots;
