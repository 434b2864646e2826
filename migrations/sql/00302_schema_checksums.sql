-- What each applied migration's file was, so a service can tell a database
-- migrated from other files than the ones it was built with.
--
-- migrations.Up records, for every migration it finds applied, the SHA-256
-- of the file it has under that version (a migration applied before this
-- table existed is recorded with the file of the first binary that migrates
-- after it). Every service checks at start that each recorded checksum
-- equals its own file's and refuses to start naming the migration
-- otherwise: a database migrated at another commit, whose migration of the
-- same number did something else, is not mistaken for this schema.

-- +goose Up
CREATE TABLE aurora_schema_checksums (
    version     bigint PRIMARY KEY,
    file        text NOT NULL CHECK (file <> ''),
    sha256      text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE aurora_schema_checksums;
