-- aurora_idempotency_key (migration 00001) was declared IMMUTABLE, but its
-- body calls convert_to, which Postgres marks STABLE. Postgres never inlines
-- a SQL function whose body is less immutable than its declaration, so every
-- caller ran the body through the SQL-function executor, one call a row: the
-- key trigger on every staged item (outbox_items_set_key), the SQL API's
-- identity lookup (00250) and outbox.Stage's. Declared STABLE (what it is),
-- the planner substitutes the expression into each caller: 19,331 keys took
-- 154 ms through the function and 62 ms as the inlined expression, measured
-- on a demo database.
--
-- The key is unchanged: the body below is 00001's, byte for byte (lowercase
-- hex SHA-256 over 4-byte big-endian length-prefixed UTF-8 parts, the same
-- as identity.Key in Go). No index or generated column uses the function,
-- which is what an IMMUTABLE declaration would be needed for.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION aurora_idempotency_key(tenant text, subject_kind text, subject_ref text, destination_account text)
RETURNS text LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(sha256(
        int4send(octet_length(convert_to(tenant, 'UTF8'))) || convert_to(tenant, 'UTF8') ||
        int4send(octet_length(convert_to(subject_kind, 'UTF8'))) || convert_to(subject_kind, 'UTF8') ||
        int4send(octet_length(convert_to(subject_ref, 'UTF8'))) || convert_to(subject_ref, 'UTF8') ||
        int4send(octet_length(convert_to(destination_account, 'UTF8'))) || convert_to(destination_account, 'UTF8')
    ), 'hex')
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION aurora_idempotency_key(tenant text, subject_kind text, subject_ref text, destination_account text)
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(sha256(
        int4send(octet_length(convert_to(tenant, 'UTF8'))) || convert_to(tenant, 'UTF8') ||
        int4send(octet_length(convert_to(subject_kind, 'UTF8'))) || convert_to(subject_kind, 'UTF8') ||
        int4send(octet_length(convert_to(subject_ref, 'UTF8'))) || convert_to(subject_ref, 'UTF8') ||
        int4send(octet_length(convert_to(destination_account, 'UTF8'))) || convert_to(destination_account, 'UTF8')
    ), 'hex')
$$;
-- +goose StatementEnd
