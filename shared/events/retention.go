package events

import (
	"context"
	"fmt"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5/pgxpool"
)

// purgeBatch bounds one purge transaction.
const purgeBatch = 1000

// sqlPurge deletes up to $3 acknowledged events older than the retention
// period $2 (seconds) with their inbox rows. Only acknowledged rows go:
// every registered consumer processed them, the catch-up query never lists
// them, and the stream has dropped their message (retention exceeds the
// stream's max age, Config.Validate), so no delivery or replay can reach
// an event whose inbox rows are gone. Dead letters, failed and dispatched
// rows are kept however old.
const sqlPurge = `
WITH old AS MATERIALIZED (
    SELECT event_id FROM event_outbox
     WHERE status = 'acknowledged'
       AND acknowledged_at < coalesce($1::timestamptz, now()) - make_interval(secs => $2)
     ORDER BY acknowledged_at
     LIMIT $3
     FOR UPDATE SKIP LOCKED),
inbox AS (DELETE FROM event_inbox i USING old WHERE i.event_id = old.event_id)
DELETE FROM event_outbox o USING old WHERE o.event_id = old.event_id`

// Purge deletes acknowledged events older than AURORA_EVENTS_RETENTION_HOURS
// and their inbox rows, in batches, and returns how many events it
// deleted. It never reopens idempotency (see sqlPurge). Errors are the
// database's, wrapped; rows deleted before one stay deleted.
func Purge(ctx context.Context, pool *pgxpool.Pool, cfg Config, clk clock.Clock) (int64, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	clk = clock.Or(clk)
	var total int64
	for {
		tag, err := pool.Exec(ctx, sqlPurge, clk.Override(), cfg.retention().Seconds(), purgeBatch)
		if err != nil {
			return total, fmt.Errorf("events: purge: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			return total, nil
		}
	}
}
