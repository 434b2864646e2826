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

// trimLimit bounds the outbox_undecided rows one trim statement deletes.
const trimLimit = 10000

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
// (JetStream redelivers unacked messages on its own).
//
// The candidates are read through outbox_undecided (migration 00311): the
// pending and leased items, plus those that left since the last trim, in
// item id order. outbox_items has no index on state, so that the
// deliverer's claim and outcome stay heap-only updates.
//
// The bumped rows need publishing again (published_dispatch < dispatch) and
// the workers publish the new generation under a new Nats-Msg-Id. FOR UPDATE
// SKIP LOCKED skips rows a worker or deliverer holds; under READ COMMITTED a
// row bumped by a concurrent sweep is re-checked and no longer matches, so
// two relays never bump the same generation twice.
const redispatchSQL = `
WITH clk AS (SELECT coalesce($1::timestamptz, now()) - make_interval(secs => $2) AS before),
stale AS MATERIALIZED (
	SELECT o.id FROM outbox_undecided u
	JOIN outbox_items o ON o.id = u.item_id
	CROSS JOIN clk
	WHERE o.published_dispatch = o.dispatch AND o.published_at < clk.before
	  AND ((o.state = 'pending' AND o.next_attempt_at <= clk.before)
	    OR (o.state = 'leased' AND o.lease_expires_at < clk.before))
	ORDER BY u.item_id
	LIMIT $3
	FOR UPDATE OF o SKIP LOCKED
)
UPDATE outbox_items o SET dispatch = o.dispatch + 1
FROM stale s
WHERE o.id = s.id
RETURNING o.id`

// trimUndecidedSQL deletes up to $1 rows of outbox_undecided whose item is
// no longer pending or leased (or no longer exists), each only at the
// generation it read: an item that moved back into pending or leased
// meanwhile had its row's generation bumped by the trigger of migration
// 00311, the delete's recheck of that row (Postgres re-reads a row updated
// after the statement's snapshot) fails on the generation, and the row
// stays. No rows are locked before the delete: two relays trimming at once
// delete each row once, the second skipping what the first deleted.
const trimUndecidedSQL = `
WITH gone AS MATERIALIZED (
	SELECT u.item_id, u.generation FROM outbox_undecided u
	LEFT JOIN outbox_items o ON o.id = u.item_id
	WHERE o.id IS NULL OR o.state NOT IN ('pending', 'leased')
	LIMIT $1
)
DELETE FROM outbox_undecided u
USING gone g
WHERE u.item_id = g.item_id AND u.generation = g.generation`

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
// wakes the workers when it bumped any, then trims outbox_undecided of the
// items that left pending and leased (trimLimit rows a statement), and
// returns how many rows it bumped in all.
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
			break
		}
	}
	for ctx.Err() == nil {
		tag, err := r.pool.Exec(ctx, trimUndecidedSQL, trimLimit)
		if err != nil {
			return total, fmt.Errorf("relay: trim undecided: %w", err)
		}
		if tag.RowsAffected() < trimLimit {
			break
		}
	}
	return total, nil
}
