package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// sweepLimit bounds the rows one sweep transaction bumps; a full sweep runs
// again at once.
const sweepLimit = 1000

// sweepLogIDs bounds the item ids one sweep's log line names.
const sweepLogIDs = 20

// redispatchSQL gives dispatch+1 to rows whose published message is presumed
// lost: published for their current dispatch (published_dispatch =
// dispatch) more than $2 seconds ago, and due for more than $2 seconds —
// pending with next_attempt_at <= now − $2, or leased with lease_expires_at <
// now − $2. JetStream's file store syncs every 2 minutes, so a broker crash
// can lose acknowledged messages; an operator can purge the stream.
//
// "Due for the interval too" is implied for a row the relay published while
// due (published_at >= next_attempt_at); it matters for a row whose
// next_attempt_at moved later after publication, or whose lease expired
// only now — its message, if it exists, gets the interval to be consumed
// (JetStream redelivers unacked messages on its own) — and it bounds the
// index range scans to rows due at least that long.
//
// The bumped rows need publishing again (published_dispatch < dispatch) and
// the workers publish the new generation under a new Nats-Msg-Id. FOR UPDATE
// SKIP LOCKED skips rows a worker or deliverer holds; under READ COMMITTED a
// row bumped by a concurrent sweep is re-checked and no longer matches, so
// two relays never bump the same generation twice.
const redispatchSQL = `
WITH stale_pending AS MATERIALIZED (
	SELECT id FROM outbox_items
	WHERE state = 'pending' AND published_dispatch = dispatch
	  AND next_attempt_at <= coalesce($1::timestamptz, now()) - make_interval(secs => $2)
	  AND published_at < coalesce($1::timestamptz, now()) - make_interval(secs => $2)
	ORDER BY next_attempt_at
	LIMIT $3
	FOR UPDATE SKIP LOCKED
), stale_leased AS MATERIALIZED (
	SELECT id FROM outbox_items
	WHERE state = 'leased' AND published_dispatch = dispatch
	  AND lease_expires_at < coalesce($1::timestamptz, now()) - make_interval(secs => $2)
	  AND published_at < coalesce($1::timestamptz, now()) - make_interval(secs => $2)
	ORDER BY lease_expires_at
	LIMIT $3
	FOR UPDATE SKIP LOCKED
)
UPDATE outbox_items o SET dispatch = o.dispatch + 1
FROM (SELECT id FROM stale_pending UNION ALL SELECT id FROM stale_leased) s
WHERE o.id = s.id
RETURNING o.id`

// sweepLoop runs the re-dispatch sweep every RedispatchScanMS.
func (r *Relay) sweepLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.redispatchScan())
	defer t.Stop()
	bo := r.newBackoff()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := r.sweep(ctx)
		if err != nil && ctx.Err() != nil {
			return
		}
		if err != nil {
			r.m.batchErrors.Inc()
			d, _ := bo.Next()
			r.log.Warn("relay: re-dispatch sweep failed", "err", err, "retry_in", d)
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		bo = r.newBackoff()
		if h := r.hooks.afterSweep; h != nil {
			h(n)
		}
	}
}

// sweep bumps every stale row (in transactions of at most sweepLimit rows),
// wakes the workers when it bumped any, and returns how many rows it bumped
// in all.
func (r *Relay) sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		rows, err := r.pool.Query(ctx, redispatchSQL, r.clk.Override(), r.cfg.RedispatchSeconds, sweepLimit)
		if err != nil {
			return total, fmt.Errorf("relay: re-dispatch: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return total, fmt.Errorf("relay: re-dispatch: %w", err)
		}
		n := len(ids)
		total += n
		if n > 0 {
			r.m.redispatched.Add(float64(n))
			// Item ids (internal, no customer data) so an operator can ask
			// why these messages were lost: the first sweepLogIDs of them.
			r.log.Info("relay: re-dispatched rows presumed lost", "rows", n, "item_ids", ids[:min(n, sweepLogIDs)])
			r.kick()
		}
		if n < sweepLimit || ctx.Err() != nil {
			return total, nil
		}
	}
}
