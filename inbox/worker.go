package inbox

import (
	"context"
	"errors"
	"fmt"
	"github.com/aurora-billing/aurora/shared/config"
	"log/slog"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Worker projects pending billing_events. Each event is handled in its own
// transaction on one pinned connection (a pgx.Tx holds one connection):
// the row is locked FOR UPDATE SKIP LOCKED (a row claimed by another replica
// is skipped), then a non-blocking pg_try_advisory_xact_lock on the event's
// Stripe customer (taken elsewhere → skipped this pass, no attempt counted);
// projections, wakeups and processed_at commit together. Any failure rolls
// back everything and releases the locks; the failed attempt is then counted
// in a separate statement, so SQL failures spend the same 12-attempt budget
// as deferrals (seed 003). No wall-clock lease exists: only a live
// transaction holds an event.
type Worker struct {
	pool    *pgxpool.Pool
	clock   clock.Clock
	batch   int
	poll    time.Duration
	metrics *Metrics
	log     *slog.Logger
}

// WorkerConfig configures NewWorker.
type WorkerConfig struct {
	// BatchSize: events per pass, 1..25. Defaults to BatchSizeDefault.
	BatchSize int
	// Poll: sleep between passes that found less than a full batch.
	// Defaults to PollMSDefault milliseconds.
	Poll time.Duration
	// Clock: nil means the database clock.
	Clock   clock.Clock
	Metrics *Metrics
	Log     *slog.Logger
}

// NewWorker returns a worker on pool.
func NewWorker(pool *pgxpool.Pool, cfg WorkerConfig) *Worker {
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = BatchSizeDefault
	}
	if cfg.Poll <= 0 {
		cfg.Poll = PollMSDefault * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Worker{pool: pool, clock: clock.Or(cfg.Clock), batch: cfg.BatchSize, poll: cfg.Poll, metrics: cfg.Metrics, log: cfg.Log}
}

// Result is what happened to one event in a pass (the label of
// aurora_inbox_worker_events_total).
type Result string

const (
	ResultApplied      Result = "applied"
	ResultStale        Result = "stale"
	ResultUnchanged    Result = "unchanged"
	ResultIgnored      Result = "ignored"
	ResultDeferred     Result = "deferred"
	ResultDeadLettered Result = "dead_lettered" // budget spent
	ResultQuarantined  Result = "quarantined"   // immediate quarantine
	ResultFailed       Result = "failed"        // projection rolled back, attempt counted
	ResultSkipped      Result = "skipped"       // row or customer held by another transaction
)

// Pass summarises one pass.
type Pass struct {
	Claimed int            // events locked and handled (skips included)
	Results map[Result]int // per result
}

// Count returns the number of events with result r.
func (p Pass) Count(r Result) int { return p.Results[r] }

// RunPass handles up to one batch of due events, each in its own
// transaction, and logs one aggregate line when the pass was not empty. An
// error means the queue could not be read; per-event failures are counted
// in the Pass.
func (w *Worker) RunPass(ctx context.Context) (Pass, error) {
	start := time.Now()
	pass := Pass{Results: map[Result]int{}}
	skipped := []string{} // skipped or failed this pass: not picked again
	var passErr error
	for pass.Claimed < w.batch && ctx.Err() == nil {
		id, r, err := w.handleNext(ctx, skipped)
		if err != nil {
			passErr = fmt.Errorf("inbox: claim next event: %w", err)
			break
		}
		if id == "" {
			break // nothing due
		}
		pass.Claimed++
		pass.Results[r]++
		w.metrics.workerResult(r)
		if r == ResultSkipped || r == ResultFailed {
			skipped = append(skipped, id)
		}
	}
	if pass.Claimed > 0 {
		attrs := []any{"claimed", pass.Claimed, "duration_ms", time.Since(start).Milliseconds()}
		for _, r := range []Result{ResultApplied, ResultStale, ResultUnchanged, ResultIgnored, ResultDeferred, ResultDeadLettered, ResultQuarantined, ResultFailed, ResultSkipped} {
			attrs = append(attrs, string(r), pass.Results[r])
		}
		w.log.Info("worker.stripe_reconciliation", attrs...)
	}
	return pass, passErr
}

// Run passes until ctx ends: immediately again after a full batch,
// otherwise after the poll interval.
func (w *Worker) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		pass, err := w.RunPass(ctx)
		if err != nil && ctx.Err() == nil {
			w.log.Warn("worker.stripe_reconciliation pass failed", "error_class", errorClass(err))
		}
		next := w.poll
		if err == nil && pass.Claimed >= w.batch && pass.Count(ResultSkipped)+pass.Count(ResultFailed) < pass.Claimed {
			next = 0
		}
		timer.Reset(next)
	}
}

// sqlClaimNext locks the next due event no other transaction holds, oldest
// due first (then Stripe time), skipping the ids this pass already skipped.
const sqlClaimNext = `
SELECT event_id, event_type, payload, attempts, coalesce($1::timestamptz, now())
  FROM billing_events
 WHERE provider = 'stripe' AND processed_at IS NULL AND dead_letter_at IS NULL
   AND next_attempt_at <= coalesce($1::timestamptz, now())
   AND event_id <> ALL($2::text[])
 ORDER BY next_attempt_at, event_created NULLS FIRST, received_at, event_id
 LIMIT 1
   FOR UPDATE SKIP LOCKED`

// sqlLockCustomer is the non-blocking, transaction-scoped advisory lock per
// Stripe customer.
const sqlLockCustomer = `SELECT pg_try_advisory_xact_lock(hashtextextended('aurora.inbox.stripe_customer:' || $1, 0))`

// decision is what a projection concluded about one event.
type decision struct {
	outcome Outcome // set when processed
	reason  Reason  // set when deferred or quarantined
	// keep: a quarantine whose queued writes still commit (an ambiguity's
	// record and the restored projections); otherwise a deferral or
	// quarantine writes nothing but the row.
	keep bool
}

func processed(o Outcome) decision { return decision{outcome: o} }
func withReason(r Reason) decision { return decision{reason: r} }

// handleNext claims and processes the next due event in its own
// transaction on one pinned connection. id is "" when nothing is due; err
// only when the claim itself failed.
func (w *Worker) handleNext(ctx context.Context, skipped []string) (id string, res Result, err error) {
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		return "", "", err
	}
	// a connection released inside a transaction is destroyed by the pool
	defer func() {
		if conn != nil {
			conn.Release()
		}
	}()
	id, res, err = w.process(ctx, conn, skipped)
	if err == nil || id == "" {
		return id, res, err
	}
	_, _ = conn.Exec(context.Background(), "ROLLBACK") // nothing of the attempt survives
	if ctx.Err() != nil {
		return id, ResultSkipped, nil // shutting down: the rollback left the row as it was
	}
	// The projection rolled back; count the attempt on its own, on the
	// connection this call already holds: asking the pool for a second one
	// while holding the first deadlocks a pool of one connection (and
	// starves the webhook and /readyz while it waits). Only a connection that
	// died is given back first and replaced.
	if conn.Conn().IsClosed() {
		conn.Release()
		if conn, err = w.pool.Acquire(ctx); err != nil {
			w.log.Warn("worker.stripe_reconciliation could not count a failed attempt", "event_id", id, "error_class", errorClass(err))
			conn = nil
			return id, ResultFailed, nil
		}
	}
	r, cerr := w.countFailure(ctx, conn, id, err)
	if cerr != nil {
		w.log.Warn("worker.stripe_reconciliation could not count a failed attempt", "event_id", id, "error_class", errorClass(cerr))
		return id, ResultFailed, nil
	}
	return id, r, nil
}

// process runs one event's transaction in three pipelined round trips:
// BEGIN + claim; the customer's advisory lock + the projection's read; the
// projection's writes + the row's settlement + COMMIT. A non-nil error with
// a non-empty id leaves the transaction for the caller to roll back.
func (w *Worker) process(ctx context.Context, conn *pgxpool.Conn, skipped []string) (string, Result, error) {
	var (
		id, evType string
		payload    []byte
		attempts   int
		now        time.Time
	)
	// Asynchronous commit, for this transaction only: a crash can lose the
	// last few hundred milliseconds of worker commits, but only whole
	// transactions, so projection and processed_at vanish together and the
	// event is projected again (the guards make that idempotent). The
	// webhook's insert stays synchronous: that commit is what Stripe's 200
	// promises.
	claim := &pgx.Batch{}
	claim.Queue("BEGIN")
	claim.Queue("SET LOCAL synchronous_commit = off")
	claim.Queue(sqlClaimNext, w.clock.Override(), skipped)
	br := conn.SendBatch(ctx, claim)
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(&id, &evType, &payload, &attempts, &now)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, pgx.ErrNoRows) {
		_, err = conn.Exec(ctx, "COMMIT")
		return "", "", err
	}
	if err != nil {
		_, _ = conn.Exec(context.Background(), "ROLLBACK")
		return "", "", err
	}
	p := &projector{tx: conn, now: now, writes: &pgx.Batch{}}
	var d decision
	ev, perr := parseEvent(payload)
	switch {
	case perr != nil:
		d = withReason(quarantineReason(perr))
	case ev.ID != id || ev.Type != evType:
		// the stored envelope columns disagree with the stored body
		d = withReason(ReasonUnrecognizedStripePayload)
	default:
		d, err = p.project(ctx, ev)
		if errors.Is(err, errCustomerBusy) {
			// another event of this customer is in flight: not an attempt
			_, err = conn.Exec(ctx, "ROLLBACK")
			return id, ResultSkipped, err
		}
		if err != nil {
			return id, "", err
		}
	}
	if d.reason != "" && !d.keep {
		p.writes = &pgx.Batch{} // a deferral or quarantine writes nothing but the row
	}
	res := settle(p.writes, id, attempts, now, d)
	p.writes.Queue("COMMIT")
	if err := conn.SendBatch(ctx, p.writes).Close(); err != nil {
		return id, "", err
	}
	return id, res, nil
}

// settle queues the row's settlement after the projection's writes.
func settle(b *pgx.Batch, id string, attempts int, now time.Time, d decision) Result {
	if d.reason == "" {
		b.Queue(`UPDATE billing_events SET processed_at = $2, outcome = $3, last_error = NULL WHERE event_id = $1`,
			id, now, string(d.outcome))
		switch d.outcome {
		case OutcomeApplied:
			return ResultApplied
		case OutcomeStale:
			return ResultStale
		case OutcomeUnchanged:
			return ResultUnchanged
		case OutcomeIgnored:
			return ResultIgnored
		default:
			panic(fmt.Sprintf("inbox: unknown outcome %q", d.outcome))
		}
	}
	n := attempts + 1
	if !d.reason.Deferred() || n >= MaxAttempts {
		b.Queue(`UPDATE billing_events SET attempts = $2, last_reason = $3, dead_letter_at = $4 WHERE event_id = $1`,
			id, n, string(d.reason), now)
		if d.reason.Deferred() {
			return ResultDeadLettered
		}
		return ResultQuarantined
	}
	next := now.Add(time.Duration(BackoffSeconds(n)) * time.Second)
	b.Queue(`UPDATE billing_events SET attempts = $2, last_reason = $3, next_attempt_at = $4 WHERE event_id = $1`,
		id, n, string(d.reason), next)
	return ResultDeferred
}

// countFailure counts a rolled-back attempt on conn (outside any
// transaction): backoff, or dead letter with ReasonProjectionFailed once the
// budget is spent.
func (w *Worker) countFailure(ctx context.Context, conn *pgxpool.Conn, id string, cause error) (Result, error) {
	class := errorClass(cause)
	var dead bool
	err := conn.QueryRow(ctx, `
UPDATE billing_events
   SET attempts = attempts + 1,
       last_reason = $2,
       last_error = $3,
       dead_letter_at = CASE WHEN attempts + 1 >= $4 THEN coalesce($5::timestamptz, now()) END,
       next_attempt_at = coalesce($5::timestamptz, now()) + make_interval(secs => least($6 * power(2, attempts), $7))
 WHERE event_id = $1 AND processed_at IS NULL AND dead_letter_at IS NULL
RETURNING dead_letter_at IS NOT NULL`,
		id, string(ReasonProjectionFailed), class, MaxAttempts, w.clock.Override(), BackoffBase, BackoffCap).Scan(&dead)
	if errors.Is(err, pgx.ErrNoRows) {
		return ResultSkipped, nil
	}
	if err != nil {
		return "", err
	}
	if dead {
		return ResultDeadLettered, nil
	}
	return ResultFailed, nil
}

// errorClass is a loggable class of err: a SQLSTATE, "timeout", or
// "error". Never the message (it may quote data).
func errorClass(err error) string {
	var pg *pgconn.PgError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &pg):
		return "sqlstate_" + pg.Code
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return "connection"
	default:
		return "error"
	}
}

// redactURL hides a URL's secrets (password, ?password=…); see config.RedactURL.
func redactURL(raw string) string { return config.RedactURL(raw) }
