-- The audit of operator changes to the webhook side's price → plan table
-- (stripe_price_plans), written by `auroractl inbox plans set --yes` in the
-- same transaction as the change: who, why, what the price mapped to
-- before (NULL: it was not mapped) and after.

-- +goose Up
CREATE TABLE stripe_price_plan_changes (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    price_id   text NOT NULL CHECK (price_id <> ''),
    prior_plan text,
    plan       text NOT NULL CHECK (plan <> ''),
    operator   text NOT NULL CHECK (operator <> ''),
    reason     text NOT NULL CHECK (reason <> ''),
    changed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stripe_price_plan_changes_price ON stripe_price_plan_changes (price_id, id);

-- +goose Down
DROP TABLE stripe_price_plan_changes;
