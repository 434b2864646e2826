-- Same-second ambiguities of the Stripe webhook inbox as one record each.
--
-- Stripe timestamps have one-second precision and Stripe delivers events in
-- no guaranteed order, so two opposite events of one subject in the same
-- second (a subscription updated and deleted; an invoice paid and failed;
-- two invoices of one customer, one paid and one failed) cannot be ordered
-- from the events alone. The worker then records one ambiguity holding
-- every event of that subject and second, restores the projections to what
-- the events before that second established, and keeps them there until an
-- operator resolves the ambiguity from Stripe's current object. The result
-- does not depend on which event arrived first.

-- +goose Up

-- One ambiguity per (kind, subject, Stripe second).
--   kind subscription: subject_id is the subscription id; reason
--     ambiguous_subscription_order.
--   kind invoice: subject_id is the Stripe customer id (every invoice outcome
--     of the customer in that second); reason ambiguous_invoice_order.
-- status open: the projections are held; resolved: an operator applied the
-- provider's state (billing_ambiguity_resolutions).
CREATE TABLE billing_ambiguities (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind          text NOT NULL CHECK (kind IN ('subscription', 'invoice')),
    reason        text NOT NULL CHECK (reason IN ('ambiguous_subscription_order', 'ambiguous_invoice_order')),
    subject_id    text NOT NULL CHECK (subject_id <> ''),
    customer_id   text NOT NULL,
    tenant        text NOT NULL,
    event_second  timestamptz NOT NULL,
    status        text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
    opened_at     timestamptz NOT NULL,
    resolved_at   timestamptz,
    CHECK ((status = 'open') = (resolved_at IS NULL)),
    CHECK ((kind = 'subscription') = (reason = 'ambiguous_subscription_order')),
    UNIQUE (kind, subject_id, event_second)
);
CREATE INDEX billing_ambiguities_open ON billing_ambiguities (opened_at) WHERE status = 'open';

-- The events of an ambiguity. An event belongs to at most one.
CREATE TABLE billing_ambiguity_events (
    event_id     text PRIMARY KEY REFERENCES billing_events (event_id),
    ambiguity_id bigint NOT NULL REFERENCES billing_ambiguities (id),
    joined_at    timestamptz NOT NULL
);
CREATE INDEX billing_ambiguity_events_ambiguity ON billing_ambiguity_events (ambiguity_id);

-- The audit of a resolution: who, why, what Stripe answered (the fetched
-- objects, as evidence) and what was projected from it.
CREATE TABLE billing_ambiguity_resolutions (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ambiguity_id     bigint NOT NULL UNIQUE REFERENCES billing_ambiguities (id),
    operator         text NOT NULL CHECK (operator <> ''),
    reason           text NOT NULL CHECK (reason <> ''),
    source           text NOT NULL CHECK (source IN ('provider')),
    provider_objects jsonb NOT NULL,
    projection       jsonb NOT NULL,
    fetched_at       timestamptz NOT NULL,
    resolved_at      timestamptz NOT NULL
);

-- What the projections were before the Stripe second they were last
-- changed in, so a same-second conflict can restore it. Written by the
-- worker with every change that moves a row to a later second.
--   stripe_subscriptions.prior: {"row": null | {status, price_id, plan,
--     current_period_end, cancel_at_period_end, last_event_id,
--     last_event_created}, "entitlement": {subscription_id,
--     subscription_status, plan}}
--   stripe_invoices.prior: {"row": null | {outcome, last_event_id,
--     last_event_created}}
--   stripe_customer_links.invoice_status_prior: {"status": null |
--     {invoice_status, invoice_status_event_id, invoice_status_event_created},
--     "entitlement": {billing_status, grace_until}}
ALTER TABLE stripe_subscriptions ADD COLUMN prior jsonb;
ALTER TABLE stripe_invoices ADD COLUMN prior jsonb;
ALTER TABLE stripe_customer_links ADD COLUMN invoice_status_prior jsonb;

-- +goose Down
ALTER TABLE stripe_customer_links DROP COLUMN invoice_status_prior;
ALTER TABLE stripe_invoices DROP COLUMN prior;
ALTER TABLE stripe_subscriptions DROP COLUMN prior;
DROP TABLE billing_ambiguity_resolutions;
DROP TABLE billing_ambiguity_events;
DROP TABLE billing_ambiguities;
