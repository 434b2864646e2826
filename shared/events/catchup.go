package events

import (
	"context"
	"fmt"
	"time"
)

// sqlListDispatched is seed 004's list_dispatched for one consumer: events
// of its types still dispatched (acknowledged ones never come back), oldest
// first, less those this consumer processed, dead-lettered, or must not
// retry yet. So a poison event never holds the batch: once dead-lettered it
// leaves the list, and while in backoff it is skipped.
const sqlListDispatched = `
SELECT o.event_id::text
  FROM event_outbox o
 WHERE o.status = 'dispatched' AND o.event_type = ANY ($2)
   AND NOT EXISTS (
       SELECT 1 FROM event_inbox i
        WHERE i.consumer = $1 AND i.event_id = o.event_id
          AND (i.status = 'processed' OR i.dead_lettered_at IS NOT NULL
               OR i.next_attempt_at > coalesce($3::timestamptz, now())))
 ORDER BY o.dispatched_at, o.event_id
 LIMIT $4`

// sqlCatchUpLag is the age of the oldest dispatched event of the types the
// consumer has neither processed nor dead-lettered, in seconds (0: none).
const sqlCatchUpLag = `
SELECT coalesce(extract(epoch FROM coalesce($3::timestamptz, now()) - min(o.dispatched_at)), 0)::float8
  FROM event_outbox o
 WHERE o.status = 'dispatched' AND o.event_type = ANY ($2)
   AND NOT EXISTS (
       SELECT 1 FROM event_inbox i
        WHERE i.consumer = $1 AND i.event_id = o.event_id
          AND (i.status = 'processed' OR i.dead_lettered_at IS NOT NULL))`

// CatchUpResult counts what one catch-up pass did.
type CatchUpResult struct {
	Listed, Processed, Duplicates, Failed, DeadLettered, Errors int
}

func (w *worker) catchUpLoop(ctx context.Context) {
	t := time.NewTicker(w.c.cfg.consumerInterval())
	defer t.Stop()
	for {
		if _, err := w.catchUp(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("events: catch-up pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// catchUp runs one pass: list up to AURORA_EVENTS_CATCH_UP_LIMIT
// dispatched events this consumer still owes, process each, update the lag
// gauge.
func (w *worker) catchUp(ctx context.Context) (CatchUpResult, error) {
	var res CatchUpResult
	rows, err := w.c.pool.Query(ctx, sqlListDispatched, w.name, w.types, w.c.clk.Override(), w.c.cfg.CatchUpLimit)
	if err != nil {
		return res, fmt.Errorf("events: list dispatched: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return res, fmt.Errorf("events: list dispatched: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("events: list dispatched: %w", err)
	}
	res.Listed = len(ids)
	for _, id := range ids {
		if ctx.Err() != nil {
			return res, nil
		}
		o, _, err := w.process(ctx, id, SourceCatchUp, nil)
		if err != nil {
			if ctx.Err() != nil {
				return res, nil
			}
			res.Errors++
			w.c.m.failures.WithLabelValues(w.name, "claim").Inc()
			w.log.Warn("events: catch-up claim failed", "event_id", id, "err", err)
			continue // the next events still get their turn
		}
		w.count(o, SourceCatchUp)
		switch o {
		case outProcessed:
			res.Processed++
		case outDuplicate:
			res.Duplicates++
		case outFailed:
			res.Failed++
		case outDeadLettered:
			res.DeadLettered++
		case outNotDue, outSkipped:
		}
	}
	var lag float64
	if err := w.c.pool.QueryRow(ctx, sqlCatchUpLag, w.name, w.types, w.c.clk.Override()).Scan(&lag); err == nil {
		w.c.m.lag.WithLabelValues(w.name).Set(max(lag, 0))
	}
	if res.Processed > 0 || res.Failed > 0 || res.DeadLettered > 0 {
		w.log.Info("events: catch-up pass", "listed", res.Listed, "processed", res.Processed,
			"duplicates", res.Duplicates, "failed", res.Failed, "dead_lettered", res.DeadLettered)
	}
	return res, nil
}

// CatchUpOnce runs one catch-up pass of consumer (registering it first),
// without the real-time path: for tools and tests that step the loop.
func (c *Client) CatchUpOnce(ctx context.Context, consumer string, types []string, h Handler) (CatchUpResult, error) {
	if err := ValidateConsumer(consumer, types); err != nil {
		return CatchUpResult{}, err
	}
	w := &worker{c: c, name: consumer, types: types, h: h, log: c.log.With("consumer", consumer)}
	if _, err := c.pool.Exec(ctx, sqlRegisterConsumer, consumer, types); err != nil {
		return CatchUpResult{}, fmt.Errorf("events: register consumer: %w", err)
	}
	return w.catchUp(ctx)
}
