-- The SQL API's functions are executable only by roles granted them.
--
-- Postgres grants EXECUTE on every new function to PUBLIC. Migration 00250
-- created the aurora.* functions without revoking it, so any role with
-- USAGE on schema aurora could call every one of them — the internal
-- SECURITY DEFINER aurora.record_usage_event (which stages billable usage
-- with any correction link) included — and the documented
-- `GRANT EXECUTE ON FUNCTION aurora.record_usage, aurora.record_usage_correction`
-- restricted nothing. After this migration a role calls exactly what it
-- was granted; the two public entry points run as their owner (SECURITY
-- DEFINER), so what they call inside needs no grant of its own. Functions
-- the migrating role adds to the schema later start without PUBLIC
-- EXECUTE too (default privileges).

-- +goose Up
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA aurora FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA aurora REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- +goose Down
ALTER DEFAULT PRIVILEGES IN SCHEMA aurora GRANT EXECUTE ON FUNCTIONS TO PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA aurora TO PUBLIC;
