package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// Handler applies one event's side effects through tx, the transaction that
// also holds the consumer's inbox claim: both commit together or neither
// does. It must not commit or roll back tx. A nil return processes the
// event; an error (or a panic) rolls everything back and records a failure:
// the event is retried after backoff and dead-lettered for this consumer
// after AURORA_EVENTS_CONSUMER_MAX_ATTEMPTS.
type Handler func(ctx context.Context, tx pgx.Tx, d Delivery) error

// Client runs consumers of domain events over one database and one
// JetStream context.
type Client struct {
	pool *pgxpool.Pool
	js   jetstream.JetStream
	cfg  Config
	clk  clock.Clock
	log  *slog.Logger
	m    *consumerMetrics

	mu      sync.Mutex
	running map[string]bool
}

// NewClient returns a Client. cfg is validated (*config.RangeError); nil
// pool or js is ErrNilDependency; a bad option ErrInvalidOption; metrics
// already registered on the registry return its error.
func NewClient(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, opts ...Option) (*Client, error) {
	if pool == nil || js == nil {
		return nil, fmt.Errorf("%w: pool and JetStream context are required", ErrNilDependency)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	m := newConsumerMetrics()
	if o.reg != nil {
		if err := m.register(o.reg); err != nil {
			return nil, err
		}
	}
	return &Client{pool: pool, js: js, cfg: cfg, clk: o.clk, log: o.log, m: m, running: map[string]bool{}}, nil
}

// ValidateConsumer checks a consumer name (1..63 of a-z, 0-9, _ and -,
// starting with a letter or digit: it names the durable JetStream consumer
// too) and its event types. It returns a *FieldError.
func ValidateConsumer(name string, types []string) error {
	if !consumerPattern.MatchString(name) {
		return &FieldError{Field: "consumer", Reason: "must be 1..63 characters of a-z, 0-9, _ and -, starting with a letter or digit"}
	}
	if len(types) == 0 {
		return &FieldError{Field: "types", Reason: "must name at least one event type"}
	}
	for _, t := range types {
		if !ValidType(t) {
			return &FieldError{Field: "types", Reason: `each must look like "Name.v1"`}
		}
	}
	return nil
}

// Consume registers consumer for types, then processes every event of
// those types until ctx ends: real-time from the durable JetStream consumer
// named after it, and from the catch-up loop every
// AURORA_EVENTS_CONSUMER_INTERVAL_MS. Several processes may run the same
// consumer (replicas): they share the durable consumer, and the inbox key
// makes a concurrent second delivery a duplicate. It returns nil when ctx
// ends, a *FieldError for a bad name or type, ErrAlreadyRunning when this
// Client already runs that consumer, an error wrapping ErrStreamConfig when
// JetStream refuses the stream or the consumer. Postgres and NATS outages
// do not end it.
func (c *Client) Consume(ctx context.Context, consumer string, types []string, h Handler) error {
	if err := ValidateConsumer(consumer, types); err != nil {
		return err
	}
	if h == nil {
		return &FieldError{Field: "handler", Reason: "must not be nil"}
	}
	c.mu.Lock()
	if c.running[consumer] {
		c.mu.Unlock()
		return fmt.Errorf("%w: consumer %s", ErrAlreadyRunning, consumer)
	}
	c.running[consumer] = true
	c.mu.Unlock()
	defer func() { c.mu.Lock(); delete(c.running, consumer); c.mu.Unlock() }()

	types = slices.Clone(types)
	slices.Sort(types)
	types = slices.Compact(types)
	w := &worker{c: c, name: consumer, types: types, h: h, log: c.log.With("consumer", consumer)}
	if err := w.register(ctx); err != nil {
		return err
	}
	if err := ensureStreamRetrying(ctx, c.js, c.cfg, c.log); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); w.catchUpLoop(ctx) }()
	go func() { defer wg.Done(); w.realtime(ctx) }()
	wg.Wait()
	return nil
}

// worker is one consumer's run.
type worker struct {
	c     *Client
	name  string
	types []string
	h     Handler
	log   *slog.Logger
}

const sqlRegisterConsumer = `
INSERT INTO event_consumers (consumer, event_types) VALUES ($1, $2)
ON CONFLICT (consumer) DO UPDATE SET event_types = EXCLUDED.event_types, last_seen_at = now()`

// register records the consumer and its types, retrying while Postgres is
// unreachable; from then on no event of those types is acknowledged before
// this consumer processed it.
func (w *worker) register(ctx context.Context) error {
	delay := 100 * time.Millisecond
	for {
		_, err := w.c.pool.Exec(ctx, sqlRegisterConsumer, w.name, w.types)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		w.log.Warn("events: register consumer failed, retrying", "err", err, "retry_in", delay)
		if !sleep(ctx, delay) {
			return nil
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// outcome is what processing one delivery came to.
type outcome int

const (
	// outProcessed: the handler committed with the inbox row.
	outProcessed outcome = iota
	// outDuplicate: the inbox already held a processed row.
	outDuplicate
	// outFailed: the handler failed; retry after the returned delay.
	outFailed
	// outDeadLettered: the handler failed its last attempt (or the event
	// was dead-lettered earlier): stop delivering it.
	outDeadLettered
	// outNotDue: a failed row whose retry time has not come; retry after
	// the returned delay.
	outNotDue
	// outSkipped: nothing to do (the event is unknown to event_outbox, e.g.
	// purged, or of a type this consumer does not handle).
	outSkipped
)

const sqlLockInbox = `
SELECT status, attempts, dead_lettered_at IS NOT NULL,
       greatest(0, extract(epoch FROM (next_attempt_at - coalesce($3::timestamptz, now()))))::float8
  FROM event_inbox WHERE consumer = $1 AND event_id = $2
   FOR UPDATE`

const sqlLoadEvent = `
SELECT event_type, aggregate_id, payload, created_at FROM event_outbox WHERE event_id = $1`

const sqlClaimNew = `
INSERT INTO event_inbox (consumer, event_id, status, attempts, claimed_at)
VALUES ($1, $2, 'processing', 1, coalesce($3::timestamptz, now()))`

const sqlClaimRetry = `
UPDATE event_inbox SET status = 'processing', attempts = attempts + 1, claimed_at = coalesce($3::timestamptz, now())
 WHERE consumer = $1 AND event_id = $2 AND status = 'failed' AND dead_lettered_at IS NULL
RETURNING attempts`

const sqlMarkProcessed = `
UPDATE event_inbox SET status = 'processed', processed_at = coalesce($3::timestamptz, now()),
       next_attempt_at = NULL, last_error = NULL
 WHERE consumer = $1 AND event_id = $2 AND status = 'processing'`

const sqlCountDuplicate = `
UPDATE event_inbox SET duplicate_deliveries = duplicate_deliveries + 1
 WHERE consumer = $1 AND event_id = $2 AND status = 'processed'`

// sqlLockOutbox serialises the settle step of the consumers of one event.
// FOR NO KEY UPDATE does not conflict with the FOR KEY SHARE locks the inbox
// foreign key takes, so a consumer mid-handler never blocks another.
const sqlLockOutbox = `SELECT event_type FROM event_outbox WHERE event_id = $1 FOR NO KEY UPDATE`

// sqlSettle, run after sqlLockOutbox in a fresh statement (so it sees every
// consumer's committed inbox row), moves the outbox row to acknowledged when
// every consumer registered for its type has processed it, or to
// dead_letter when each of them processed or dead-lettered it and at least
// one dead-lettered it. It changes nothing otherwise.
const sqlSettle = `
WITH need AS (
    SELECT i.status, i.dead_lettered_at
      FROM event_consumers c
      LEFT JOIN event_inbox i ON i.consumer = c.consumer AND i.event_id = $1
     WHERE $2 = ANY (c.event_types)),
verdict AS (
    SELECT CASE
             WHEN NOT EXISTS (SELECT 1 FROM need) THEN NULL
             WHEN NOT EXISTS (SELECT 1 FROM need WHERE status IS DISTINCT FROM 'processed') THEN 'acknowledged'
             WHEN NOT EXISTS (SELECT 1 FROM need WHERE status IS DISTINCT FROM 'processed' AND dead_lettered_at IS NULL) THEN 'dead_letter'
           END AS status)
UPDATE event_outbox o
   SET status = v.status,
       lease_expires_at = NULL,
       acknowledged_at = CASE WHEN v.status = 'acknowledged' THEN coalesce($3::timestamptz, now()) END,
       dead_lettered_at = CASE WHEN v.status = 'dead_letter' THEN coalesce($3::timestamptz, now()) END,
       last_reason = CASE WHEN v.status = 'dead_letter' THEN 'consumers_dead_lettered' ELSE o.last_reason END
  FROM verdict v
 WHERE o.event_id = $1 AND v.status IS NOT NULL
   AND o.status IN ('dispatching', 'dispatched', 'failed')
RETURNING o.status`

// settle locks the event's outbox row and applies sqlSettle inside tx.
func settle(ctx context.Context, tx pgx.Tx, clk clock.Clock, id string) error {
	var typ string
	if err := tx.QueryRow(ctx, sqlLockOutbox, id).Scan(&typ); err != nil {
		return fmt.Errorf("events: settle: lock event: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlSettle, id, typ, clk.Override()); err != nil {
		return fmt.Errorf("events: settle: %w", err)
	}
	return nil
}

// process runs one delivery of event id through the inbox claim and the
// handler. It returns the outcome and, for outFailed and outNotDue, when to
// try again. An error means the claim itself failed (Postgres unreachable,
// a constraint other than the inbox key): retried, counted, never taken as
// new or duplicate.
func (w *worker) process(ctx context.Context, id string, src Source, beat func()) (outcome, time.Duration, error) {
	now := w.c.clk.Override()
	tx, err := w.c.pool.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("events: claim: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after commit

	var (
		status  string
		prior   int
		dead    bool
		waitSec float64
	)
	attempt := 1
	err = tx.QueryRow(ctx, sqlLockInbox, w.name, id, now).Scan(&status, &prior, &dead, &waitSec)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// no row yet: the INSERT below is the claim
	case err != nil:
		return 0, 0, fmt.Errorf("events: claim: read inbox: %w", err)
	case status == string(InboxProcessed):
		if _, err := tx.Exec(ctx, sqlCountDuplicate, w.name, id); err != nil {
			return 0, 0, fmt.Errorf("events: claim: count duplicate: %w", err)
		}
		return outDuplicate, 0, tx.Commit(ctx)
	case dead:
		return outDeadLettered, 0, nil
	case waitSec > 0:
		return outNotDue, time.Duration(waitSec * float64(time.Second)), nil
	}

	var d Delivery
	d.ID, d.Source = id, src
	var payload []byte
	err = tx.QueryRow(ctx, sqlLoadEvent, id).Scan(&d.Type, &d.AggregateID, &payload, &d.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		w.log.Warn("events: delivery of an event event_outbox does not hold (purged, or another database's); skipped", "event_id", id)
		return outSkipped, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("events: claim: load event: %w", err)
	}
	d.Payload = payload
	if !slices.Contains(w.types, d.Type) {
		return outSkipped, 0, nil
	}

	if status == "" {
		if _, err := tx.Exec(ctx, sqlClaimNew, w.name, id, now); err != nil {
			if IsDuplicateClaim(err) {
				// a concurrent claimer (another replica, the other path)
				// committed first: skipped silently
				_ = tx.Rollback(ctx)
				if _, err := w.c.pool.Exec(ctx, sqlCountDuplicate, w.name, id); err != nil {
					w.log.Debug("events: count duplicate", "event_id", id, "err", err)
				}
				return outDuplicate, 0, nil
			}
			return 0, 0, fmt.Errorf("events: claim: insert inbox: %w", err)
		}
	} else {
		if err := tx.QueryRow(ctx, sqlClaimRetry, w.name, id, now).Scan(&attempt); err != nil {
			return 0, 0, fmt.Errorf("events: claim: retry: %w", err)
		}
	}
	d.Attempt = attempt

	stop := heartbeat(ctx, beat, w.c.cfg.ackWait()/3)
	herr := runHandler(ctx, w.h, tx, d)
	stop()
	if herr == nil {
		if _, err := tx.Exec(ctx, sqlMarkProcessed, w.name, id, now); err != nil {
			herr = fmt.Errorf("events: mark processed: %w", err)
		} else if err := settle(ctx, tx, w.c.clk, id); err != nil {
			herr = err
		} else if err := tx.Commit(ctx); err != nil {
			herr = fmt.Errorf("events: commit: %w", err)
		} else {
			return outProcessed, 0, nil
		}
	}
	_ = tx.Rollback(context.WithoutCancel(ctx))
	if ctx.Err() != nil {
		return 0, 0, ctx.Err() // stopping: the delivery comes back, nothing is recorded
	}
	return w.recordFailure(ctx, id, attempt, herr)
}

// runHandler runs h, turning a panic into an error.
func runHandler(ctx context.Context, h Handler, tx pgx.Tx, d Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("events: handler panicked: %v", r)
		}
	}()
	return h(ctx, tx, d)
}

// heartbeat calls beat every period until the returned stop is called (the
// JetStream message's InProgress, so AckWait does not expire mid-handler).
func heartbeat(ctx context.Context, beat func(), period time.Duration) func() {
	if beat == nil || period <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				beat()
			}
		}
	}()
	return func() { close(done) }
}

// sqlRecordFailure writes the failed attempt $3 (the claim's attempt
// number; the claim itself rolled back with the handler): failed with a
// retry time, dead-lettered with reason $6 when $3 reached the budget $5.
// A row processed meanwhile (by a replica) is left alone.
const sqlRecordFailure = `
INSERT INTO event_inbox AS i (consumer, event_id, status, attempts, next_attempt_at, last_error, claimed_at,
                              dead_lettered_at, dead_letter_reason)
VALUES ($1, $2, 'failed', $3::int, coalesce($7::timestamptz, now()) + make_interval(secs => $4::float8), left($8::text, 500),
        coalesce($7::timestamptz, now()),
        CASE WHEN $3::int >= $5::int THEN coalesce($7::timestamptz, now()) END,
        CASE WHEN $3::int >= $5::int THEN $6::text END)
ON CONFLICT ON CONSTRAINT event_inbox_pkey DO UPDATE
   SET status = 'failed', attempts = EXCLUDED.attempts, next_attempt_at = EXCLUDED.next_attempt_at,
       last_error = EXCLUDED.last_error, dead_lettered_at = EXCLUDED.dead_lettered_at,
       dead_letter_reason = EXCLUDED.dead_letter_reason
 WHERE i.status <> 'processed'
RETURNING dead_lettered_at IS NOT NULL`

func (w *worker) recordFailure(ctx context.Context, id string, attempt int, herr error) (outcome, time.Duration, error) {
	wait := backoff(w.c.cfg.ConsumerBackoffBaseMS, w.c.cfg.ConsumerBackoffCapMS, attempt)
	w.c.m.failures.WithLabelValues(w.name, "handler").Inc()
	tx, err := w.c.pool.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("events: record failure: %w (handler: %w)", err, herr)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	var dead bool
	err = tx.QueryRow(ctx, sqlRecordFailure, w.name, id, attempt, wait.Seconds(), w.c.cfg.ConsumerMaxAttempts,
		string(ReasonHandlerExhausted), w.c.clk.Override(), herr.Error()).Scan(&dead)
	if errors.Is(err, pgx.ErrNoRows) {
		return outDuplicate, 0, tx.Commit(ctx) // a replica processed it meanwhile
	}
	if err != nil {
		return 0, 0, fmt.Errorf("events: record failure: %w (handler: %w)", err, herr)
	}
	if dead {
		if err := settle(ctx, tx, w.c.clk, id); err != nil {
			return 0, 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("events: record failure: commit: %w", err)
	}
	if dead {
		w.c.m.deadLetters.WithLabelValues(w.name, string(ReasonHandlerExhausted)).Inc()
		w.log.Error("events: event dead-lettered for consumer", "event_id", id, "attempts", attempt,
			"reason", ReasonHandlerExhausted, "err", herr)
		return outDeadLettered, 0, nil
	}
	w.log.Warn("events: handler failed, will retry", "event_id", id, "attempt", attempt, "retry_in", wait, "err", herr)
	return outFailed, wait, nil
}

// sqlDeadLetter dead-letters (consumer, event) with reason $3 unless it is
// processed: JetStream's MAX_DELIVERIES advisory.
const sqlDeadLetter = `
INSERT INTO event_inbox AS i (consumer, event_id, status, attempts, last_error, claimed_at, dead_lettered_at, dead_letter_reason)
VALUES ($1, $2, 'failed', 0, $5, coalesce($4::timestamptz, now()), coalesce($4::timestamptz, now()), $3)
ON CONFLICT ON CONSTRAINT event_inbox_pkey DO UPDATE
   SET status = 'failed', dead_lettered_at = EXCLUDED.dead_lettered_at, dead_letter_reason = EXCLUDED.dead_letter_reason,
       last_error = coalesce(i.last_error, EXCLUDED.last_error)
 WHERE i.status <> 'processed' AND i.dead_lettered_at IS NULL
RETURNING 1`

func (w *worker) deadLetter(ctx context.Context, id string, reason Reason, detail string) error {
	tx, err := w.c.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	var one int
	err = tx.QueryRow(ctx, sqlDeadLetter, w.name, id, string(reason), w.c.clk.Override(), detail).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // processed, or dead-lettered already
	}
	if err != nil {
		return fmt.Errorf("events: dead letter: %w", err)
	}
	if err := settle(ctx, tx, w.c.clk, id); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	w.c.m.deadLetters.WithLabelValues(w.name, string(reason)).Inc()
	w.log.Error("events: event dead-lettered for consumer", "event_id", id, "reason", reason)
	return nil
}

func (w *worker) count(o outcome, src Source) {
	switch o {
	case outProcessed:
		w.c.m.processed.WithLabelValues(w.name, string(src)).Inc()
	case outDuplicate:
		w.c.m.duplicates.WithLabelValues(w.name, string(src)).Inc()
	case outFailed, outDeadLettered, outNotDue, outSkipped:
	}
}
