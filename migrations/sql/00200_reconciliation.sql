-- Reconciliation (seed 000, "Reconciliation"): the reconciler's runs, the
-- summary windows it compared, the meter error reports it fetched, and the
-- reconciliation items (the differences a person resolves).

-- +goose Up

-- One row per difference found. fingerprint names the difference (its kind
-- and subject): a later run finding the same difference updates what it
-- observed instead of adding a row. Resolving records who looked and what
-- they did; nothing else changes.
CREATE TABLE reconciliation_items (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind                text NOT NULL CHECK (kind IN (
                            'summary_shortfall', 'summary_excess', 'async_rejection', 'error_report_unattributed',
                            'unconfirmed_acceptance', 'late_after_finalization', 'invoice_quantity_mismatch',
                            'unmapped_price', 'reversal_without_grant', 'local_drift')),
    fingerprint         text NOT NULL UNIQUE CHECK (fingerprint <> ''),
    state               text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'resolved')),
    tenant              text NOT NULL DEFAULT '',
    feature             text NOT NULL DEFAULT '',
    destination_account text NOT NULL DEFAULT '',
    meter_id            text NOT NULL DEFAULT '',
    period_start        timestamptz,
    period_end          timestamptz,
    expected            numeric,
    observed            numeric,
    detail              text NOT NULL CHECK (detail <> ''),
    outbox_item_ids     bigint[] NOT NULL DEFAULT '{}',
    first_seen_at       timestamptz NOT NULL DEFAULT now(),
    last_seen_at        timestamptz NOT NULL DEFAULT now(),
    observed_changed_at timestamptz,
    resolution          text CHECK (resolution IS NULL OR btrim(resolution) <> ''),
    resolved_by         text CHECK (resolved_by IS NULL OR btrim(resolved_by) <> ''),
    resolved_at         timestamptz,
    CHECK ((state = 'resolved') = (resolution IS NOT NULL AND resolved_by IS NOT NULL AND resolved_at IS NOT NULL))
);
CREATE INDEX reconciliation_items_open_idx ON reconciliation_items (first_seen_at, id) WHERE state = 'open';
CREATE INDEX reconciliation_items_outbox_idx ON reconciliation_items USING gin (outbox_item_ids);

-- Every summary window the reconciler looked at, per (destination account,
-- customer, meter) and [window_start, window_end): what we committed, what
-- Stripe's summary said, whether the window was settled (older than the
-- settle lag) and whether the two matched. A window compared again
-- overwrites its row.
CREATE TABLE reconciliation_windows (
    destination_account text NOT NULL,
    stripe_customer     text NOT NULL,
    meter_id            text NOT NULL,
    window_start        timestamptz NOT NULL,
    window_end          timestamptz NOT NULL CHECK (window_end > window_start),
    committed           numeric NOT NULL,
    observed            numeric,
    settled             boolean NOT NULL,
    matched             boolean NOT NULL DEFAULT false,
    compared_at         timestamptz NOT NULL DEFAULT now(),
    run_id              bigint,
    PRIMARY KEY (destination_account, stripe_customer, meter_id, window_start),
    CHECK (NOT matched OR settled)
);

-- Stripe meter error reports (v1.billing.meter.error_report_triggered and
-- v1.billing.meter.no_meter_found thin events), as fetched from
-- /v2/core/events/{id}. data is the full event's data object.
CREATE TABLE meter_error_reports (
    event_id         text PRIMARY KEY CHECK (event_id <> ''),
    event_type       text NOT NULL,
    meter_id         text NOT NULL DEFAULT '',
    event_created    timestamptz,
    validation_start timestamptz,
    validation_end   timestamptz,
    error_count      bigint NOT NULL DEFAULT 0,
    data             jsonb NOT NULL DEFAULT '{}'::jsonb,
    fetched_at       timestamptz NOT NULL DEFAULT now()
);

-- One row per reconciler run (local or provider).
CREATE TABLE reconciler_runs (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind              text NOT NULL CHECK (kind IN ('local', 'provider')),
    started_at        timestamptz NOT NULL DEFAULT now(),
    -- windows ending at or before this instant were settled for the run
    settled_before    timestamptz,
    finished_at       timestamptz,
    ok                boolean,
    error_class       text,
    windows_compared  integer NOT NULL DEFAULT 0,
    windows_unsettled integer NOT NULL DEFAULT 0,
    windows_matched   integer NOT NULL DEFAULT 0,
    items_confirmed   integer NOT NULL DEFAULT 0,
    findings_new      integer NOT NULL DEFAULT 0,
    findings_updated  integer NOT NULL DEFAULT 0,
    provider_requests integer NOT NULL DEFAULT 0
);
CREATE INDEX reconciler_runs_ok_idx ON reconciler_runs (finished_at) WHERE ok;

-- Accepted items by meter event timestamp: the items each run compares and
-- may confirm.
CREATE INDEX outbox_items_accepted_idx ON outbox_items (occurred_at) WHERE state = 'accepted';

-- +goose Down
DROP INDEX outbox_items_accepted_idx;
DROP TABLE reconciler_runs;
DROP TABLE meter_error_reports;
DROP TABLE reconciliation_windows;
DROP TABLE reconciliation_items;
