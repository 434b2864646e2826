-- The SQL API for recording usage from any language (schema aurora).
--
-- aurora.record_usage(tenant, event_id, feature, quantity, occurred_at) and
-- aurora.record_usage_correction(tenant, event_id, corrects_event_id,
-- feature, quantity, occurred_at) record a durable usage event and stage its
-- export item in the caller's transaction, with the rules of the Go recorder
-- (usage.Gate.Record in shared/usage): the same validation, the same
-- idempotency by (tenant, event_id), the same correction checks, the same
-- cutover gate (period_buffered) and the same staging (identity, key,
-- mapping version). A refusal raises an error with its own SQLSTATE (class
-- AU, listed below) and a message that starts like the Go error's; the
-- caller's transaction is then aborted (roll back, or call inside a
-- SAVEPOINT to keep the rest of the transaction).
--
--   AU001 usage: invalid <field>            (the column name is the error's COLUMN field)
--   AU002 usage: event_conflict             (event id reused with other content)
--   AU003 usage: corrected_event_unknown
--   AU004 usage: correction_exceeds_value
--   AU005 usage: already_cancelled          (DETAIL names the correction to correct instead)
--   AU006 outbox: invalid <field>           (the staged item's identity; COLUMN set)
--   AU007 outbox: payload_conflict
--   AU010 aurora: recording_not_configured  (aurora.recording_settings is empty)
--
-- What the Go recorder takes from its configuration (destination account,
-- mode, usage period, exporter, feature sources) the SQL API reads from
-- aurora.recording_settings and aurora.feature_sources, written by
-- `auroractl usage configure`. They must say what the services' environment
-- says (AURORA_STRIPE_ACCOUNT, AURORA_STRIPE_MODE, AURORA_USAGE_PERIOD,
-- AURORA_FEATURE_SOURCES).
--
-- The functions are SECURITY DEFINER: an application role needs only
-- USAGE on schema aurora and EXECUTE on the two functions, no rights on the
-- outbox tables.

-- +goose Up
CREATE SCHEMA aurora;

-- One row: where recorded usage goes and how it is counted.
CREATE TABLE aurora.recording_settings (
    singleton           boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    destination_account text NOT NULL CHECK (destination_account <> ''),
    mode                text NOT NULL CHECK (mode IN ('test', 'live')),
    usage_period        text NOT NULL CHECK (usage_period IN ('hour', 'day', 'month')),
    exporter            text NOT NULL DEFAULT 'stripe_meter_events' CHECK (exporter <> ''),
    updated_by          text NOT NULL CHECK (updated_by <> ''),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- feature → source (AURORA_FEATURE_SOURCES); a feature not listed counts
-- (counters), so its events are quarantined period_buffered unless a
-- cutover watermark says its period is recorded.
CREATE TABLE aurora.feature_sources (
    feature    text PRIMARY KEY CHECK (feature ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'),
    source     text NOT NULL CHECK (source IN ('counters', 'events')),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The characters Go's strings.TrimSpace removes (unicode.IsSpace).
CREATE FUNCTION aurora.is_blank(v text) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT v IS NULL OR btrim(v, E' \t\n\u000b\f\r\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000') = ''
$$;

-- The start (UTC) of the period containing at (usage.Period.Start).
CREATE FUNCTION aurora.period_start(period text, at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc(CASE WHEN period IN ('hour', 'month') THEN period ELSE 'day' END, at, 'UTC')
$$;

-- field.Text: the reason an identifier-like text is refused, or NULL: not
-- blank, at most max_bytes bytes of UTF-8, no U+FFFD and no control
-- characters (Go's unicode.IsControl: U+0000–U+001F, U+007F–U+009F).
-- Postgres text is always valid UTF-8 and never holds NUL.
-- +goose StatementBegin
CREATE FUNCTION aurora.text_refusal(v text, max_bytes integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    bad text;
BEGIN
    IF aurora.is_blank(v) THEN RETURN 'must not be empty'; END IF;
    IF octet_length(v) > max_bytes THEN
        RETURN format('is %s bytes, longer than %s', octet_length(v), max_bytes);
    END IF;
    bad := substring(v FROM E'[\u0001-\u001f\u007f-\u009f\ufffd]');
    IF bad = E'\ufffd' THEN RETURN 'must not contain U+FFFD (replaced invalid text)'; END IF;
    IF bad IS NOT NULL THEN RETURN 'must not contain control characters'; END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- field.Feature: the reason a feature name is refused, or NULL.
CREATE FUNCTION aurora.feature_refusal(v text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN coalesce(v, '') = '' THEN 'must not be empty'
        WHEN v !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$' THEN 'must match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$ (letters, digits, _ . -; at most 100 bytes)'
    END
$$;

-- The first refusal of usage.Event.Validate for these fields, as
-- {field, reason}, or NULL when they are valid (field.Text with 255 bytes
-- for tenant, event_id and corrects_event_id; field.Feature; a quantity of
-- at most 15 significant digits, field.MaxQuantity). A correction has a
-- non-empty corrects_event_id. occurred_at NULL is Go's zero time.
-- +goose StatementBegin
CREATE FUNCTION aurora.usage_event_refusal(tenant text, event_id text, feature text, quantity bigint,
    occurred_at timestamptz, corrects_event_id text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    r text;
BEGIN
    r := aurora.text_refusal(tenant, 255);
    IF r IS NOT NULL THEN RETURN ARRAY['tenant', r]; END IF;
    r := aurora.text_refusal(event_id, 255);
    IF r IS NOT NULL THEN RETURN ARRAY['event_id', r]; END IF;
    r := aurora.feature_refusal(feature);
    IF r IS NOT NULL THEN RETURN ARRAY['feature', r]; END IF;
    IF occurred_at IS NULL THEN RETURN ARRAY['occurred_at', 'must be set']; END IF;
    IF NOT isfinite(occurred_at) THEN RETURN ARRAY['occurred_at', 'must be a finite time']; END IF;
    IF quantity IS NULL THEN RETURN ARRAY['quantity', 'must be set']; END IF;
    IF coalesce(corrects_event_id, '') = '' AND quantity < 0 THEN
        RETURN ARRAY['quantity', 'must be >= 0 for an event (use a correction to remove usage)'];
    END IF;
    IF abs(quantity) > 999999999999999 THEN
        RETURN ARRAY['quantity', 'has more than 15 significant digits (at most 999999999999999 in magnitude; Stripe refuses more)'];
    END IF;
    IF coalesce(corrects_event_id, '') <> '' THEN
        r := aurora.text_refusal(corrects_event_id, 255);
        IF r IS NOT NULL THEN RETURN ARRAY['corrects_event_id', r]; END IF;
        IF corrects_event_id = event_id THEN
            RETURN ARRAY['corrects_event_id', 'an event cannot correct itself'];
        END IF;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- The first refusal of identity.Identity.Validate for the string parts of
-- an item's identity, as {field, reason}, or NULL (field.Text: tenant and
-- destination_account at most 255 bytes, subject_ref and exporter 1024).
-- +goose StatementBegin
CREATE FUNCTION aurora.identity_refusal(tenant text, subject_ref text, exporter text, destination_account text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    part record;
    r    text;
BEGIN
    FOR part IN SELECT * FROM (VALUES (1, 'tenant', tenant, 255), (2, 'subject_ref', subject_ref, 1024),
            (3, 'exporter', exporter, 1024), (4, 'destination_account', destination_account, 255)) AS p(n, name, v, max_bytes)
            ORDER BY n LOOP
        r := aurora.text_refusal(part.v, part.max_bytes);
        IF r IS NOT NULL THEN RETURN ARRAY[part.name, r]; END IF;
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- The value record event_id carries at Stripe once delivered
-- (usage.ValueAtStripe): an event's quantity, a positive correction's
-- quantity, a negative correction's quantity plus the value of what it
-- corrects. NULL when a record of the chain is missing.
-- +goose StatementBegin
CREATE FUNCTION aurora.value_at_stripe(p_tenant text, p_event_id text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    acc bigint := 0;
    id  text := p_event_id;
    r   record;
BEGIN
    FOR i IN 1..1000 LOOP
        SELECT kind, quantity, corrects_event_id INTO r FROM usage_events WHERE tenant = p_tenant AND event_id = id;
        IF NOT FOUND THEN RETURN NULL; END IF;
        IF r.kind = 'event' OR r.quantity >= 0 OR r.corrects_event_id IS NULL THEN
            RETURN acc + r.quantity;
        END IF;
        acc := acc + r.quantity;
        id := r.corrects_event_id;
    END LOOP;
    RAISE EXCEPTION 'usage: correction chain of "%" is longer than 1000', p_event_id;
END
$$;
-- +goose StatementEnd

-- The one implementation behind record_usage (p_corrects NULL) and
-- record_usage_correction (p_corrects the corrected event id, '' refused):
-- usage.Gate.Record step by step (validate; shared cutover lock and
-- watermark; a correction's checks against the record it corrects; store
-- the event idempotently; stage its item quarantined period_buffered when
-- its period is buffered; link the event to the item).
-- +goose StatementBegin
CREATE FUNCTION aurora.record_usage_event(p_tenant text, p_event_id text, p_feature text, p_quantity bigint,
    p_occurred_at timestamptz, p_corrects text)
RETURNS TABLE (item_id bigint, idempotency_key text, state text, quarantine_reason text, created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    refusal     text[];
    cfg         aurora.recording_settings;
    corrects    text := nullif(p_corrects, '');
    v_kind      text;
    v_ref       text;
    v_period    timestamptz;
    w           timestamptz;
    scheduled   boolean;
    src         text;
    reason      text;
    target      record;
    by_id       text;
    v           bigint;
    same        boolean;
    existing    bigint;
    version     integer;
    item        bigint;
BEGIN
    refusal := aurora.usage_event_refusal(p_tenant, p_event_id, p_feature, p_quantity, p_occurred_at, corrects);
    IF refusal IS NULL AND p_corrects = '' THEN
        -- record_usage_correction without the record it corrects
        refusal := ARRAY['corrects_event_id', 'must not be empty for a correction'];
    END IF;
    IF refusal IS NOT NULL THEN
        RAISE EXCEPTION 'usage: invalid %: %', refusal[1], refusal[2] USING ERRCODE = 'AU001', COLUMN = refusal[1];
    END IF;
    SELECT * INTO cfg FROM aurora.recording_settings;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'aurora: recording_not_configured: aurora.recording_settings is empty'
            USING ERRCODE = 'AU010', HINT = 'run auroractl usage configure with the services'' account, mode and period';
    END IF;
    v_kind := CASE WHEN corrects IS NULL THEN 'event' ELSE 'correction' END;
    v_ref := v_kind || ':' || p_event_id;
    v_period := aurora.period_start(cfg.usage_period, p_occurred_at);

    -- The cutover gate (usage.LockedWatermarkFor): the shared lock first, so
    -- a schedule or reschedule cannot move the watermark before commit.
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('aurora.usage_cutover:' || p_feature, 0));
    SELECT c.watermark INTO w FROM usage_cutovers c
    WHERE c.feature = p_feature AND c.tenant IN (p_tenant, '') ORDER BY c.tenant = '' LIMIT 1;
    scheduled := FOUND;

    -- A correction's checks (usage.CheckCorrection).
    IF corrects IS NOT NULL THEN
        IF p_quantity = 0 THEN
            RAISE EXCEPTION 'usage: invalid quantity: a correction must change the quantity (non-zero)'
                USING ERRCODE = 'AU001', COLUMN = 'quantity';
        END IF;
        SELECT e.feature, e.occurred_at INTO target FROM usage_events e
        WHERE e.tenant = p_tenant AND e.event_id = corrects FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'usage: corrected_event_unknown: "%"', corrects USING ERRCODE = 'AU003';
        END IF;
        IF target.feature <> p_feature THEN
            RAISE EXCEPTION 'usage: invalid feature: must be the feature of the corrected record'
                USING ERRCODE = 'AU001', COLUMN = 'feature';
        END IF;
        IF aurora.period_start(cfg.usage_period, target.occurred_at) <> v_period THEN
            RAISE EXCEPTION 'usage: invalid occurred_at: must lie in the period of the corrected record'
                USING ERRCODE = 'AU001', COLUMN = 'occurred_at';
        END IF;
        IF p_quantity < 0 THEN
            SELECT e.event_id INTO by_id FROM usage_events e
            WHERE e.tenant = p_tenant AND e.corrects_event_id = corrects AND e.kind = 'correction'
              AND e.quantity < 0 AND e.event_id <> p_event_id
            ORDER BY e.recorded_at LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'usage: already_cancelled: "%" was cancelled by correction "%"; correct that one instead', corrects, by_id
                    USING ERRCODE = 'AU005', DETAIL = 'cancelled_by=' || by_id;
            END IF;
            v := aurora.value_at_stripe(p_tenant, corrects);
            IF v IS NULL THEN
                RAISE EXCEPTION 'usage: corrected_event_unknown: "%"', corrects USING ERRCODE = 'AU003';
            END IF;
            IF v + p_quantity < 0 THEN
                RAISE EXCEPTION 'usage: correction_exceeds_value: "%" carries %, the correction removes %', corrects, v, -p_quantity
                    USING ERRCODE = 'AU004';
            END IF;
        END IF;
    END IF;

    -- The era of the period (usage.EraOf): the watermark decides when one is
    -- scheduled, otherwise the feature's source.
    SELECT fs.source INTO src FROM aurora.feature_sources fs WHERE fs.feature = p_feature;
    IF (scheduled AND v_period < w) OR (NOT scheduled AND coalesce(src, 'counters') <> 'events') THEN
        reason := 'period_buffered';
    END IF;

    -- Store the event idempotently by (tenant, event_id) (usage.Recorder.Record).
    INSERT INTO usage_events (tenant, event_id, kind, feature, quantity, occurred_at, corrects_event_id)
    VALUES (p_tenant, p_event_id, v_kind, p_feature, p_quantity, p_occurred_at, corrects)
    ON CONFLICT ON CONSTRAINT usage_events_pkey DO NOTHING;
    IF NOT FOUND THEN
        SELECT e.kind = v_kind AND e.feature = p_feature AND e.quantity = p_quantity AND e.occurred_at = p_occurred_at
               AND e.corrects_event_id IS NOT DISTINCT FROM corrects, e.item_id
        INTO same, existing FROM usage_events e WHERE e.tenant = p_tenant AND e.event_id = p_event_id;
        IF NOT same THEN
            RAISE EXCEPTION 'usage: event_conflict: tenant event "%" was recorded with different content', p_event_id
                USING ERRCODE = 'AU002';
        END IF;
        IF existing IS NOT NULL THEN
            RETURN QUERY SELECT o.id, o.idempotency_key, o.state, o.quarantine_reason, false
                FROM outbox_items o WHERE o.id = existing;
            RETURN;
        END IF;
    END IF;

    -- Stage the item (outbox.Stage) for the feature's current mapping
    -- version on the destination account (0 = not mapped yet).
    refusal := aurora.identity_refusal(p_tenant, v_ref, cfg.exporter, cfg.destination_account);
    IF refusal IS NOT NULL THEN
        RAISE EXCEPTION 'outbox: invalid %: %', refusal[1], refusal[2] USING ERRCODE = 'AU006', COLUMN = refusal[1];
    END IF;
    SELECT coalesce((SELECT m.mapping_version FROM meter_mappings m
        WHERE m.destination_account = cfg.destination_account AND m.feature = p_feature), 0) INTO version;
    INSERT INTO outbox_items AS o (tenant, subject_kind, subject_ref, exporter, destination_account, mode,
        mapping_version, idempotency_key, feature, quantity, occurred_at, period_start, payload, state, quarantine_reason)
    VALUES (p_tenant, v_kind, v_ref, cfg.exporter, cfg.destination_account, cfg.mode, version, '', p_feature,
        p_quantity, p_occurred_at, v_period, '{}'::jsonb, CASE WHEN reason IS NULL THEN 'pending' ELSE 'quarantined' END, reason)
    ON CONFLICT ON CONSTRAINT outbox_items_identity_key DO NOTHING
    RETURNING o.id INTO item;
    IF item IS NULL THEN
        SELECT o.id, o.feature = p_feature AND o.quantity = p_quantity AND o.occurred_at = p_occurred_at
               AND o.period_start = v_period AND o.payload = '{}'::jsonb
        INTO item, same FROM outbox_items o
        WHERE o.idempotency_key = aurora_idempotency_key(p_tenant, v_kind, v_ref, cfg.destination_account)
          AND o.tenant = p_tenant AND o.subject_kind = v_kind AND o.subject_ref = v_ref AND o.exporter = cfg.exporter
          AND o.destination_account = cfg.destination_account AND o.mode = cfg.mode AND o.mapping_version = version;
        IF NOT same THEN
            RAISE EXCEPTION 'outbox: payload_conflict: item % has the same identity and a different payload', item
                USING ERRCODE = 'AU007';
        END IF;
    END IF;
    UPDATE usage_events e SET item_id = item WHERE e.tenant = p_tenant AND e.event_id = p_event_id;
    RETURN QUERY SELECT o.id, o.idempotency_key, o.state, o.quarantine_reason, true FROM outbox_items o WHERE o.id = item;
END
$$;
-- +goose StatementEnd

-- aurora.record_usage records one usage event (quantity >= 0 units of
-- feature, at occurred_at) in the caller's transaction and returns its
-- export item: (item_id, idempotency_key, state, quarantine_reason, created).
-- Recording the same event again returns the same item with created false.
CREATE FUNCTION aurora.record_usage(tenant text, event_id text, feature text, quantity bigint, occurred_at timestamptz)
RETURNS TABLE (item_id bigint, idempotency_key text, state text, quarantine_reason text, created boolean)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT * FROM aurora.record_usage_event($1, $2, $3, $4, $5, NULL)
$$;

-- aurora.record_usage_correction records a correction of corrects_event_id
-- (same tenant, feature and period): quantity is the signed change, +2 adds
-- two units to what the corrected record billed, -2 takes two off.
CREATE FUNCTION aurora.record_usage_correction(tenant text, event_id text, corrects_event_id text, feature text,
    quantity bigint, occurred_at timestamptz)
RETURNS TABLE (item_id bigint, idempotency_key text, state text, quarantine_reason text, created boolean)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT * FROM aurora.record_usage_event($1, $2, $4, $5, $6, coalesce($3, ''))
$$;

-- +goose Down
DROP SCHEMA aurora CASCADE;
