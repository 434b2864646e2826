-- Stripe webhook inbox (seed 003): the durable billing_events inbox, the
-- customer↔tenant linkage, subscription and invoice projections, the
-- price→plan mapping, each tenant's entitlement, and the audit trail of
-- operator requeues.

-- +goose Up

-- One row per Stripe event id. The raw request body is stored verbatim
-- (payload, bytea: not even whitespace is changed). The row is pending while
-- processed_at and dead_letter_at are both NULL; the worker sets processed_at
-- together with the projection, or dead_letter_at on quarantine.
CREATE TABLE billing_events (
    event_id        text PRIMARY KEY CHECK (event_id <> ''),
    provider        text NOT NULL DEFAULT 'stripe' CHECK (provider IN ('stripe')),
    -- envelope fields read at ingest; the worker re-reads the payload and
    -- quarantines the row when they are unusable
    event_type      text NOT NULL,
    api_version     text,
    event_created   timestamptz,
    livemode        boolean NOT NULL DEFAULT false,
    -- the Stripe customer the event's object names (NULL when none): the
    -- wakeup key when a checkout links this customer
    customer_id     text,
    payload         bytea NOT NULL,
    payload_sha256  bytea NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    -- the durable attempt budget: deferrals and failed projections count
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- the reason code of the last deferral or quarantine (inbox.Reason)
    last_reason     text,
    -- a short error class of the last failed projection (never payload data)
    last_error      text,
    processed_at    timestamptz,
    -- how a processed event ended (inbox.Outcome)
    outcome         text,
    dead_letter_at  timestamptz,
    CHECK (processed_at IS NULL OR dead_letter_at IS NULL)
);

-- the due queue: pending rows by due time
CREATE INDEX billing_events_due ON billing_events (next_attempt_at, event_created NULLS FIRST, received_at, event_id)
    WHERE processed_at IS NULL AND dead_letter_at IS NULL;
-- wakeups on linkage
CREATE INDEX billing_events_customer ON billing_events (customer_id)
    WHERE processed_at IS NULL AND customer_id IS NOT NULL;
-- inventory and dead-letter listing
CREATE INDEX billing_events_dead_letter ON billing_events (dead_letter_at)
    WHERE processed_at IS NULL AND dead_letter_at IS NOT NULL;

-- A redelivered event id whose body differs from the stored one: kept, never
-- applied (Stripe event ids are unique; a different body under one id is
-- evidence for an operator, not a new event).
CREATE TABLE billing_event_id_conflicts (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       text NOT NULL REFERENCES billing_events (event_id),
    payload        bytea NOT NULL,
    payload_sha256 bytea NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_id, payload_sha256)
);

-- Operator requeues of single dead letters (seed 003: "document the operator
-- and reason, then re-enable only that single row").
CREATE TABLE billing_event_requeues (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        text NOT NULL REFERENCES billing_events (event_id),
    operator        text NOT NULL CHECK (operator <> ''),
    reason          text NOT NULL CHECK (reason <> ''),
    prior_attempts  integer NOT NULL,
    prior_reason    text,
    prior_dead_letter_at timestamptz,
    requeued_at     timestamptz NOT NULL DEFAULT now()
);

-- Customer ↔ tenant linkage, from checkout.session.completed. One customer
-- per tenant and one tenant per customer; a checkout that would rebind
-- either is quarantined (ambiguous_customer_linkage).
CREATE TABLE stripe_customer_links (
    customer_id    text PRIMARY KEY CHECK (customer_id <> ''),
    tenant         text NOT NULL UNIQUE CHECK (tenant <> ''),
    linked_by_event text NOT NULL,
    linked_at      timestamptz NOT NULL DEFAULT now(),
    -- customer-level monotonic invoice guard: the Stripe event time of the
    -- invoice outcome that set the tenant's billing status
    invoice_status_event_created timestamptz,
    invoice_status_event_id      text,
    invoice_status               text CHECK (invoice_status IN ('paid', 'failed'))
);

-- price → plan, maintained by operators. An empty table is
-- stripe_price_config_missing; a price not in it is unmapped_stripe_price.
CREATE TABLE stripe_price_plans (
    price_id   text PRIMARY KEY CHECK (price_id <> ''),
    plan       text NOT NULL CHECK (plan <> ''),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Subscriptions as last applied. last_event_created is the subscription
-- timestamp guard.
CREATE TABLE stripe_subscriptions (
    subscription_id      text PRIMARY KEY CHECK (subscription_id <> ''),
    customer_id          text NOT NULL,
    tenant               text NOT NULL,
    status               text NOT NULL,
    price_id             text,
    plan                 text,
    current_period_end   timestamptz,
    cancel_at_period_end boolean NOT NULL DEFAULT false,
    last_event_id        text NOT NULL,
    last_event_created   timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stripe_subscriptions_tenant ON stripe_subscriptions (tenant);

-- Invoice outcomes as last applied. last_event_created is the invoice-level
-- guard (an older payment_failed never undoes an applied paid).
CREATE TABLE stripe_invoices (
    invoice_id         text PRIMARY KEY CHECK (invoice_id <> ''),
    customer_id        text NOT NULL,
    tenant             text NOT NULL,
    subscription_id    text NOT NULL,
    outcome            text NOT NULL CHECK (outcome IN ('paid', 'failed')),
    last_event_id      text NOT NULL,
    last_event_created timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- The tenant's entitlement: plan from its subscription (through
-- stripe_price_plans), billing status from its invoices.
CREATE TABLE tenant_entitlements (
    tenant              text PRIMARY KEY CHECK (tenant <> ''),
    customer_id         text NOT NULL,
    subscription_id     text,
    subscription_status text,
    plan                text,
    billing_status      text NOT NULL DEFAULT 'none' CHECK (billing_status IN ('none', 'current', 'grace')),
    grace_until         timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE tenant_entitlements;
DROP TABLE stripe_invoices;
DROP TABLE stripe_subscriptions;
DROP TABLE stripe_price_plans;
DROP TABLE stripe_customer_links;
DROP TABLE billing_event_requeues;
DROP TABLE billing_event_id_conflicts;
DROP TABLE billing_events;
