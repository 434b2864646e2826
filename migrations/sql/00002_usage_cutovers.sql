-- Cutover watermark per (tenant, feature) (seed 000, "Cutting a feature over
-- from counting to recording"). tenant = '' applies to every tenant that has
-- no row of its own. The buffered reporter stages windows only for periods
-- starting before the watermark; events for periods before it are
-- quarantined period_buffered (at stage time and again at send time).

-- +goose Up
CREATE TABLE usage_cutovers (
    tenant       text NOT NULL DEFAULT '',
    feature      text NOT NULL CHECK (feature <> ''),
    watermark    timestamptz NOT NULL,
    -- bumps on every reschedule; part of the expected state an operator sends
    version      integer NOT NULL DEFAULT 1 CHECK (version >= 1),
    scheduled_by text NOT NULL CHECK (scheduled_by <> ''),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, feature)
);

-- recovery actions may concern a cutover rather than an item
ALTER TABLE recovery_actions ADD COLUMN subject jsonb;

-- +goose Down
ALTER TABLE recovery_actions DROP COLUMN subject;
DROP TABLE usage_cutovers;
