-- Which exporter sends a destination account's items (issue 16): 'v1',
-- one /v1/billing/meter_events call per item (the default, as before), or
-- 'stream', Stripe's v2 meter event stream in batches of up to 100. The
-- idempotency key and the payload are the same either way, so an account
-- can move between them without double billing within Stripe's 24 h
-- identifier dedupe. Read by the deliverer at every claim.

-- +goose Up
ALTER TABLE stripe_accounts
    ADD COLUMN exporter text NOT NULL DEFAULT 'v1' CHECK (exporter IN ('v1', 'stream'));

-- +goose Down
ALTER TABLE stripe_accounts DROP COLUMN exporter;
