-- outbox_items' one BEFORE UPDATE trigger ran PL/pgSQL on every update of
-- every item: the deliverer's claim, its outcome write and the relay's mark,
-- three calls an item on the export path, each comparing thirteen columns
-- (the payload's jsonb among them). Dropping it took 5 % of the CPU of a
-- demo run (0.95x CPU, 1.06x items/s, six pairs). The rules it enforced
-- stay exactly as they were; only when PL/pgSQL runs changes.
--
-- * Identity and payload are immutable: outbox_items_identity_immutable
--   fires only on an UPDATE whose SET list names one of those columns
--   (BEFORE UPDATE OF ...), and refuses it when a value differs, as before.
--   No writer of aurora names them, so no aurora update runs it. An update
--   that does not name a column cannot change it (no other trigger of the
--   table writes NEW's identity columns).
-- * updated_at is now() on every update except the relay's mark
--   (published_dispatch, published_at only), which keeps it (migration
--   00308). outbox_items_touch sets it as before, but its WHEN clause
--   (evaluated by the executor, no PL/pgSQL) skips the call when the update
--   already wrote the value the rule asks for: the deliverer's claim and
--   outcome write set updated_at = now() themselves, the mark does not
--   touch it. Any other writer, or one that sets another value, is still
--   corrected by the trigger.

-- +goose Up
DROP TRIGGER outbox_items_immutable ON outbox_items;
DROP FUNCTION outbox_items_immutable();

-- +goose StatementBegin
CREATE FUNCTION outbox_items_identity_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
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
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_items_identity_immutable
    BEFORE UPDATE OF tenant, subject_kind, subject_ref, exporter, destination_account, mode,
        mapping_version, idempotency_key, feature, quantity, occurred_at, period_start, payload
    ON outbox_items
    FOR EACH ROW EXECUTE FUNCTION outbox_items_identity_immutable();

-- +goose StatementBegin
CREATE FUNCTION outbox_items_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.published_dispatch IS DISTINCT FROM OLD.published_dispatch
       AND (NEW.state, NEW.dispatch, NEW.lease_token, NEW.next_attempt_at, NEW.attempts)
           IS NOT DISTINCT FROM (OLD.state, OLD.dispatch, OLD.lease_token, OLD.next_attempt_at, OLD.attempts)
    THEN
        NEW.updated_at := OLD.updated_at;
    ELSE
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- The WHEN clause is the function's rule: it fires exactly when NEW's
-- updated_at is not already what the function would set.
CREATE TRIGGER outbox_items_touch
    BEFORE UPDATE ON outbox_items
    FOR EACH ROW
    WHEN (NEW.updated_at IS DISTINCT FROM (CASE
        WHEN NEW.published_dispatch IS DISTINCT FROM OLD.published_dispatch
         AND (NEW.state, NEW.dispatch, NEW.lease_token, NEW.next_attempt_at, NEW.attempts)
             IS NOT DISTINCT FROM (OLD.state, OLD.dispatch, OLD.lease_token, OLD.next_attempt_at, OLD.attempts)
        THEN OLD.updated_at
        ELSE now()
    END))
    EXECUTE FUNCTION outbox_items_touch();

-- +goose Down
DROP TRIGGER outbox_items_touch ON outbox_items;
DROP FUNCTION outbox_items_touch();
DROP TRIGGER outbox_items_identity_immutable ON outbox_items;
DROP FUNCTION outbox_items_identity_immutable();

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
    IF NEW.published_dispatch IS DISTINCT FROM OLD.published_dispatch
       AND (NEW.state, NEW.dispatch, NEW.lease_token, NEW.next_attempt_at, NEW.attempts)
           IS NOT DISTINCT FROM (OLD.state, OLD.dispatch, OLD.lease_token, OLD.next_attempt_at, OLD.attempts)
    THEN
        NEW.updated_at := OLD.updated_at;
    ELSE
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_items_immutable BEFORE UPDATE ON outbox_items
    FOR EACH ROW EXECUTE FUNCTION outbox_items_immutable();
