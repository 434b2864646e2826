-- Domain events between services (seed 004): the producer-side outbox
-- (event_outbox), the consumers registered for each event type
-- (event_consumers), the consumer-side dedupe inbox (event_inbox) and the
-- audit trail of operator requeues (event_requeues). The Go side is
-- shared/events; docs/events.md states the rules.

-- +goose Up

-- One row per domain event, written by events.Publish in the producer's own
-- transaction. The relay's event dispatcher moves it pending → dispatching →
-- dispatched (or failed → … → dead_letter); the consumers' processed inbox
-- rows move it to acknowledged, the terminal state no catch-up query reads.
CREATE TABLE event_outbox (
    event_id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    -- "Name.vN", the stream subject's last two tokens
    event_type        text NOT NULL CHECK (event_type ~ '^[A-Z][A-Za-z0-9]{0,99}\.v[1-9][0-9]{0,3}$'),
    aggregate_id      text NOT NULL CHECK (aggregate_id <> '' AND length(aggregate_id) <= 200),
    payload           jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    status            text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'dispatching', 'dispatched', 'acknowledged', 'failed', 'dead_letter')),
    -- dispatch attempts (publishes tried); the dead_letter budget counts them
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    -- while dispatching: after this instant another dispatcher may take it
    lease_expires_at  timestamptz,
    -- the stream sequence JetStream acknowledged (the first one, for a duplicate)
    stream_seq        bigint,
    -- reason code of the last failure or of the dead letter (events.Reason)
    last_reason       text,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    dispatched_at     timestamptz,
    acknowledged_at   timestamptz,
    dead_lettered_at  timestamptz,
    CHECK ((status = 'dispatching') = (lease_expires_at IS NOT NULL)),
    CHECK ((status = 'acknowledged') = (acknowledged_at IS NOT NULL)),
    CHECK ((status = 'dead_letter') = (dead_lettered_at IS NOT NULL))
);

-- the dispatcher's claim: due pending/failed rows and expired leases
CREATE INDEX event_outbox_due ON event_outbox (next_attempt_at)
    WHERE status IN ('pending', 'failed');
CREATE INDEX event_outbox_lease ON event_outbox (lease_expires_at)
    WHERE status = 'dispatching';
-- the catch-up loop: dispatched events of a consumer's types, oldest first
CREATE INDEX event_outbox_dispatched ON event_outbox (event_type, dispatched_at, event_id)
    WHERE status = 'dispatched';
-- retention: acknowledged rows by age
CREATE INDEX event_outbox_acknowledged ON event_outbox (acknowledged_at)
    WHERE status = 'acknowledged';

ALTER TABLE event_outbox SET (autovacuum_vacuum_scale_factor = 0.02, fillfactor = 90);

-- Immutable once written: the event is a fact.
-- +goose StatementBegin
CREATE FUNCTION event_outbox_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.event_id <> OLD.event_id OR NEW.event_type <> OLD.event_type
       OR NEW.aggregate_id <> OLD.aggregate_id OR NEW.payload <> OLD.payload
       OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'event_outbox: event % is immutable', OLD.event_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
-- +goose StatementEnd
CREATE TRIGGER event_outbox_immutable BEFORE UPDATE ON event_outbox
    FOR EACH ROW EXECUTE FUNCTION event_outbox_immutable();

-- Wake the dispatcher when an event commits (NOTIFY inside a transaction is
-- delivered at commit; one per transaction is enough, Postgres folds equal
-- payloads).
-- +goose StatementBegin
CREATE FUNCTION event_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('aurora_events', '');
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER event_outbox_notify AFTER INSERT ON event_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION event_outbox_notify();

-- Every consumer that events.Consume registered, with the event types it
-- handles. An event is acknowledged only when each consumer registered for
-- its type has processed it.
CREATE TABLE event_consumers (
    consumer       text PRIMARY KEY CHECK (consumer ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    event_types    text[] NOT NULL CHECK (cardinality(event_types) > 0),
    registered_at  timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_consumers_types ON event_consumers USING gin (event_types);

-- One row per (consumer, event): the dedupe key is the primary key. A
-- consumer inserts it as processing in the transaction of its handler and
-- sets processed before commit; a handler failure is recorded as failed in a
-- transaction of its own (attempts, next_attempt_at), and after the budget
-- the row is dead-lettered (dead_lettered_at, dead_letter_reason).
-- 'duplicate' is the outcome of a claim that found the key taken; the
-- processed row counts such deliveries in duplicate_deliveries.
CREATE TABLE event_inbox (
    consumer              text NOT NULL REFERENCES event_consumers (consumer),
    event_id              uuid NOT NULL REFERENCES event_outbox (event_id),
    status                text NOT NULL CHECK (status IN ('processing', 'processed', 'failed', 'duplicate')),
    attempts              integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at       timestamptz,
    last_error            text,
    claimed_at            timestamptz NOT NULL DEFAULT now(),
    processed_at          timestamptz,
    duplicate_deliveries  integer NOT NULL DEFAULT 0 CHECK (duplicate_deliveries >= 0),
    dead_lettered_at      timestamptz,
    dead_letter_reason    text,
    CONSTRAINT event_inbox_pkey PRIMARY KEY (consumer, event_id),
    CHECK ((status = 'processed') = (processed_at IS NOT NULL)),
    CHECK (dead_lettered_at IS NULL OR (status = 'failed' AND dead_letter_reason IS NOT NULL))
);
CREATE INDEX event_inbox_event ON event_inbox (event_id);
CREATE INDEX event_inbox_dead ON event_inbox (consumer, dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL;

-- Every operator requeue, applied or refused.
CREATE TABLE event_requeues (
    id           bigserial PRIMARY KEY,
    event_id     uuid NOT NULL,
    consumer     text,
    operator     text NOT NULL CHECK (operator <> ''),
    reason       text NOT NULL CHECK (reason <> ''),
    outcome      text NOT NULL CHECK (outcome IN ('applied', 'refused')),
    detail       text,
    requested_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_requeues_event ON event_requeues (event_id);

-- +goose Down
DROP TABLE event_requeues;
DROP TABLE event_inbox;
DROP TABLE event_consumers;
DROP TRIGGER event_outbox_notify ON event_outbox;
DROP FUNCTION event_outbox_notify();
DROP TRIGGER event_outbox_immutable ON event_outbox;
DROP FUNCTION event_outbox_immutable();
DROP TABLE event_outbox;
