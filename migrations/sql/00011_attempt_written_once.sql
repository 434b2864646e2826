-- An attempt row is written once, when its outcome is recorded, instead of
-- being inserted at the claim and updated with the outcome: one write per
-- attempt instead of two, and no lookup of an open row (which the planner
-- answered with sequential scans of the whole attempts table on a young
-- database). The lease itself says what is in flight: state 'leased',
-- lease_token, and leased_at (added here), the database time of the claim.
--
-- A holder that never records (killed) gets its attempt row from the claim
-- that takes the item over after the lease expired: outcome stale_lease,
-- error_code lease_taken_over, started_at = its leased_at. If the holder was
-- only slow, its late write is refused and fills that row in.

-- +goose Up
ALTER TABLE outbox_items ADD COLUMN leased_at timestamptz;

-- +goose Down
ALTER TABLE outbox_items DROP COLUMN leased_at;
