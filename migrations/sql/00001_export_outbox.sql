-- Export side of aurora (seed 000): outbox items, attempts, recovery actions,
-- feature→meter mappings, tenant billing, durable usage events, buffered
-- counters and usage windows.

-- +goose Up

-- Stripe destination accounts. An item is sent only to a confirmed account
-- whose mode matches the item's (pre-send checks account_unconfirmed and
-- mode_mismatch).
CREATE TABLE stripe_accounts (
    account_id   text PRIMARY KEY CHECK (account_id <> ''),
    mode         text NOT NULL CHECK (mode IN ('test', 'live')),
    confirmed    boolean NOT NULL DEFAULT false,
    confirmed_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- tenant → Stripe customer on a destination account (pre-send check
-- customer_missing).
CREATE TABLE tenant_billing (
    tenant              text NOT NULL CHECK (tenant <> ''),
    destination_account text NOT NULL REFERENCES stripe_accounts (account_id),
    stripe_customer     text CHECK (stripe_customer IS NULL OR stripe_customer <> ''),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, destination_account)
);

-- feature → Stripe meter, per destination account. mapping_version increases
-- on every change of the mapping; an item records the version it was built
-- for, and a requeue across a version change is refused (mapping_changed).
CREATE TABLE meter_mappings (
    destination_account text NOT NULL REFERENCES stripe_accounts (account_id),
    feature             text NOT NULL CHECK (feature <> ''),
    meter_id            text NOT NULL CHECK (meter_id <> ''),
    event_name          text NOT NULL CHECK (event_name <> ''),
    customer_key        text NOT NULL DEFAULT 'stripe_customer_id',
    value_key           text NOT NULL DEFAULT 'value',
    mapping_version     integer NOT NULL DEFAULT 1 CHECK (mapping_version >= 1),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (destination_account, feature)
);

CREATE TABLE outbox_items (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- the seven-part identity (immutable)
    tenant              text NOT NULL CHECK (tenant <> ''),
    subject_kind        text NOT NULL CHECK (subject_kind IN ('usage_window', 'event', 'correction')),
    subject_ref         text NOT NULL CHECK (subject_ref <> ''),
    exporter            text NOT NULL CHECK (exporter <> ''),
    destination_account text NOT NULL CHECK (destination_account <> ''),
    mode                text NOT NULL CHECK (mode IN ('test', 'live')),
    mapping_version     integer NOT NULL CHECK (mapping_version >= 0),
    -- derived from the identity by the insert trigger; never supplied by Go alone
    idempotency_key     text NOT NULL,
    -- the payload (immutable)
    feature             text NOT NULL CHECK (feature <> ''),
    quantity            bigint NOT NULL,
    occurred_at         timestamptz NOT NULL,   -- sent as the meter event timestamp; fixed at stage time
    period_start        timestamptz NOT NULL,   -- usage period the quantity belongs to
    payload             jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(payload) = 'object'),
    -- state machine
    state               text NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'leased', 'accepted', 'confirmed', 'uncertain', 'rejected', 'quarantined')),
    quarantine_reason   text,
    lease_token         bigint NOT NULL DEFAULT 0,
    lease_expires_at    timestamptz,
    attempts            integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    first_attempt_at    timestamptz,
    -- relay bookkeeping: dispatch is the generation of "this item became due";
    -- published_dispatch is the generation whose message JetStream acked.
    dispatch            integer NOT NULL DEFAULT 1 CHECK (dispatch >= 1),
    published_dispatch  integer NOT NULL DEFAULT 0 CHECK (published_dispatch >= 0),
    published_at        timestamptz,
    last_error          text,
    provider_ref        text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_items_identity_key UNIQUE
        (tenant, subject_kind, subject_ref, exporter, destination_account, mode, mapping_version),
    CONSTRAINT outbox_items_quarantine_reason CHECK ((state = 'quarantined') = (quarantine_reason IS NOT NULL)),
    CONSTRAINT outbox_items_lease CHECK (state <> 'leased' OR lease_expires_at IS NOT NULL)
);

-- Claimed-and-updated rows churn; keep the hot table vacuumed early
-- (FACTS.md: claim queries slow as dead index entries pile up).
ALTER TABLE outbox_items SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 2000
);

-- Relay: rows that still need their current dispatch published.
CREATE INDEX outbox_items_unpublished_idx ON outbox_items (next_attempt_at)
    WHERE state IN ('pending', 'leased') AND published_dispatch < dispatch;
-- Relay re-dispatch and deliverer claim: pending rows by due time.
CREATE INDEX outbox_items_pending_due_idx ON outbox_items (next_attempt_at) WHERE state = 'pending';
-- Relay: leased rows whose lease may have expired.
CREATE INDEX outbox_items_leased_expiry_idx ON outbox_items (lease_expires_at) WHERE state = 'leased';
-- Operators: uncertain and quarantined items by age.
CREATE INDEX outbox_items_uncertain_idx ON outbox_items (updated_at) WHERE state = 'uncertain';
CREATE INDEX outbox_items_quarantined_idx ON outbox_items (quarantine_reason, updated_at) WHERE state = 'quarantined';
-- Lookup by the identifier Stripe knows (reconciliation, operators).
CREATE INDEX outbox_items_key_idx ON outbox_items (idempotency_key);

-- aurora_idempotency_key mirrors identity.Key in Go: lowercase hex SHA-256
-- over 4-byte big-endian length-prefixed UTF-8 parts.
CREATE FUNCTION aurora_idempotency_key(tenant text, subject_kind text, subject_ref text, destination_account text)
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(sha256(
        int4send(octet_length(convert_to(tenant, 'UTF8'))) || convert_to(tenant, 'UTF8') ||
        int4send(octet_length(convert_to(subject_kind, 'UTF8'))) || convert_to(subject_kind, 'UTF8') ||
        int4send(octet_length(convert_to(subject_ref, 'UTF8'))) || convert_to(subject_ref, 'UTF8') ||
        int4send(octet_length(convert_to(destination_account, 'UTF8'))) || convert_to(destination_account, 'UTF8')
    ), 'hex')
$$;

-- +goose StatementBegin
CREATE FUNCTION outbox_items_set_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.idempotency_key := aurora_idempotency_key(NEW.tenant, NEW.subject_kind, NEW.subject_ref, NEW.destination_account);
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_items_set_key BEFORE INSERT ON outbox_items
    FOR EACH ROW EXECUTE FUNCTION outbox_items_set_key();

-- Identity and payload are immutable once written: enforced here, not only in Go.
-- +goose StatementBegin
CREATE FUNCTION outbox_items_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.tenant, NEW.subject_kind, NEW.subject_ref, NEW.exporter, NEW.destination_account, NEW.mode,
        NEW.mapping_version, NEW.idempotency_key, NEW.feature, NEW.quantity, NEW.occurred_at, NEW.period_start, NEW.payload)
       IS DISTINCT FROM
       (OLD.tenant, OLD.subject_kind, OLD.subject_ref, OLD.exporter, OLD.destination_account, OLD.mode,
        OLD.mapping_version, OLD.idempotency_key, OLD.feature, OLD.quantity, OLD.occurred_at, OLD.period_start, OLD.payload)
    THEN
        RAISE EXCEPTION 'outbox_items % identity and payload are immutable', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_items_immutable BEFORE UPDATE ON outbox_items
    FOR EACH ROW EXECUTE FUNCTION outbox_items_immutable();

-- Wake the relay when rows commit (NOTIFY inside a transaction is delivered
-- on commit; one per statement, coalesced by Postgres per transaction).
-- +goose StatementBegin
CREATE FUNCTION outbox_items_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('aurora_outbox', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_items_notify AFTER INSERT ON outbox_items
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_items_notify();

-- One row per delivery attempt.
CREATE TABLE outbox_attempts (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id           bigint NOT NULL REFERENCES outbox_items (id),
    attempt           integer NOT NULL,
    lease_token       bigint NOT NULL,
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz,
    outcome           text CHECK (outcome IN ('accepted', 'retry', 'uncertain', 'rejected', 'quarantined', 'stale_lease')),
    http_status       integer,
    stripe_request_id text,
    error_code        text,
    error_message     text,
    UNIQUE (item_id, lease_token)
);

-- Every operator recovery call, applied or refused.
CREATE TABLE recovery_actions (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id    bigint REFERENCES outbox_items (id),
    action     text NOT NULL CHECK (action <> ''),
    actor      text NOT NULL CHECK (actor <> ''),
    reason     text NOT NULL,
    evidence   text NOT NULL DEFAULT '',
    expected   jsonb NOT NULL DEFAULT '{}'::jsonb,
    observed   jsonb NOT NULL DEFAULT '{}'::jsonb,
    applied    boolean NOT NULL,
    refusal    text,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (applied = (refusal IS NULL))
);
CREATE INDEX recovery_actions_item_idx ON recovery_actions (item_id, id);

-- Durable usage facts of the recording era: events and corrections.
CREATE TABLE usage_events (
    tenant            text NOT NULL CHECK (tenant <> ''),
    event_id          text NOT NULL CHECK (event_id <> ''),
    kind              text NOT NULL CHECK (kind IN ('event', 'correction')),
    feature           text NOT NULL CHECK (feature <> ''),
    quantity          bigint NOT NULL,
    occurred_at       timestamptz NOT NULL,
    corrects_event_id text,
    item_id           bigint REFERENCES outbox_items (id),
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, event_id),
    CHECK ((kind = 'correction') = (corrects_event_id IS NOT NULL))
);

-- Buffered era: a counter per (tenant, feature, period).
CREATE TABLE usage_counters (
    tenant       text NOT NULL,
    feature      text NOT NULL,
    period_start timestamptz NOT NULL,
    count        bigint NOT NULL DEFAULT 0 CHECK (count >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, feature, period_start)
);

-- The ledger position of a buffered period and the link to its staged
-- window item. acknowledged_to advances on acceptance; abandon clears
-- staged_item_id and bumps generation so the same bounds restage under a new
-- identity.
CREATE TABLE usage_windows (
    tenant          text NOT NULL,
    feature         text NOT NULL,
    period_start    timestamptz NOT NULL,
    acknowledged_to bigint NOT NULL DEFAULT 0 CHECK (acknowledged_to >= 0),
    generation      integer NOT NULL DEFAULT 0 CHECK (generation >= 0),
    staged_item_id  bigint REFERENCES outbox_items (id),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, feature, period_start)
);

-- +goose Down
DROP TABLE usage_windows;
DROP TABLE usage_counters;
DROP TABLE usage_events;
DROP TABLE recovery_actions;
DROP TABLE outbox_attempts;
DROP TABLE outbox_items;
DROP FUNCTION outbox_items_notify();
DROP FUNCTION outbox_items_immutable();
DROP FUNCTION outbox_items_set_key();
DROP FUNCTION aurora_idempotency_key(text, text, text, text);
DROP TABLE meter_mappings;
DROP TABLE tenant_billing;
DROP TABLE stripe_accounts;
