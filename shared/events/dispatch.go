package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgxlisten"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// NotifyChannel is the channel event_outbox's insert trigger NOTIFYs at
// commit (migrations/sql/00300_domain_events.sql).
const NotifyChannel = "aurora_events"

// Dispatcher publishes committed, due event_outbox rows to AURORA_EVENTS.
// Any number may run against one database: the claim takes rows with FOR
// UPDATE SKIP LOCKED and leases them (dispatching) for
// AURORA_EVENTS_DISPATCH_LEASE_SECONDS; a dispatcher that dies mid-publish
// leaves its rows to the next claim after the lease, and JetStream drops the
// republish of an id it already stored (Nats-Msg-Id = event id) inside the
// duplicate window.
type Dispatcher struct {
	pool *pgxpool.Pool
	js   jetstream.JetStream
	cfg  Config
	clk  clock.Clock
	log  *slog.Logger
	m    *dispatchMetrics

	wake    chan struct{}
	started atomic.Bool
	// running is true from the moment Run has ensured the stream and
	// dispatches until Run returns (Ready).
	running atomic.Bool
	// afterPublish, when set by a test, runs after the PubAcks and before
	// the marks; an error ends the batch like a process killed there.
	afterPublish func(ids []string) error
}

// Option configures a Dispatcher or a Client.
type Option func(*options) error

type options struct {
	clk clock.Clock
	log *slog.Logger
	reg prometheus.Registerer
}

// WithClock sets the clock whose Override is "now" in every SQL decision
// (due, lease, backoff, retention). Default: the database clock.
func WithClock(c clock.Clock) Option {
	return func(o *options) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		o.clk = c
		return nil
	}
}

// WithLogger sets the logger (default slog.Default()). Logs carry event ids,
// types, consumers and counts, never payloads.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		o.log = l
		return nil
	}
}

// WithRegistry registers the metrics on reg (docs/events.md lists them).
// Without it they are counted and not exported.
func WithRegistry(reg prometheus.Registerer) Option {
	return func(o *options) error {
		if reg == nil {
			return fmt.Errorf("%w: nil registry", ErrInvalidOption)
		}
		o.reg = reg
		return nil
	}
}

func buildOptions(opts []Option) (options, error) {
	o := options{clk: clock.DB{}, log: slog.Default()}
	for _, fn := range opts {
		if err := fn(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// NewDispatcher returns a dispatcher over pool (the events database) and js
// (a JetStream context on a connection the caller owns, with
// jetstream.WithPublishAsyncMaxPending of at least cfg.DispatchBatchSize).
// cfg is validated (*config.RangeError); nil pool or js is
// ErrNilDependency; a bad option ErrInvalidOption.
func NewDispatcher(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, opts ...Option) (*Dispatcher, error) {
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
	m := newDispatchMetrics()
	if o.reg != nil {
		if err := m.register(o.reg); err != nil {
			return nil, err
		}
	}
	return &Dispatcher{pool: pool, js: js, cfg: cfg, clk: o.clk, log: o.log, m: m, wake: make(chan struct{}, 1)}, nil
}

// Run ensures the stream (retrying while NATS is unreachable), then
// dispatches until ctx ends, woken by NOTIFY with a polling fallback, and
// runs Purge every AURORA_EVENTS_RETENTION_SCAN_SECONDS. It returns nil
// after a graceful stop (the batch in progress finishes), an error wrapping
// ErrStreamConfig when JetStream refuses the stream, ErrAlreadyRunning on a
// second call. Postgres and NATS outages never end it.
func (d *Dispatcher) Run(ctx context.Context) error {
	if !d.started.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	if err := ensureStreamRetrying(ctx, d.js, d.cfg, d.log); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	d.running.Store(true)
	defer d.running.Store(false)
	d.log.Info("events: dispatcher running", "batch_size", d.cfg.DispatchBatchSize, "poll_ms", d.cfg.DispatchPollMS)
	done := make(chan struct{}, 3)
	go func() { d.listen(ctx); done <- struct{}{} }()
	go func() { d.poll(ctx); done <- struct{}{} }()
	go func() { d.retentionLoop(ctx); done <- struct{}{} }()
	d.kick()
	d.work(ctx)
	for range 3 {
		<-done
	}
	d.log.Info("events: dispatcher stopped")
	return nil
}

// Ready returns nil while Run dispatches: the stream is ensured and Run has
// not returned. Before that (Run not called, or still retrying the stream
// while JetStream is unreachable or disabled) and after Run returned it
// returns an error wrapping ErrDispatcherNotRunning. It is the relay's
// /readyz check "events_dispatcher"; ctx is unused (it reads a flag).
func (d *Dispatcher) Ready(context.Context) error {
	if !d.running.Load() {
		return ErrDispatcherNotRunning
	}
	return nil
}

func ensureStreamRetrying(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) error {
	delay := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := EnsureStream(actx, js, cfg)
		cancel()
		if err == nil || errors.Is(err, ErrStreamConfig) {
			return err
		}
		log.Warn("events: stream not ensured yet, retrying", "err", err, "retry_in", delay)
		if !sleep(ctx, delay) {
			return ctx.Err()
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (d *Dispatcher) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *Dispatcher) work(ctx context.Context) {
	delay := msDur(d.cfg.DispatchBackoffBaseMS)
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		}
		for ctx.Err() == nil {
			n, err := d.DispatchOnce(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				d.m.batchErrors.Inc()
				d.log.Warn("events: dispatch batch failed, backing off", "err", err, "retry_in", delay)
				if !sleep(ctx, delay) {
					return
				}
				delay = min(2*delay, msDur(d.cfg.DispatchBackoffCapMS))
				continue
			}
			delay = msDur(d.cfg.DispatchBackoffBaseMS)
			if n < d.cfg.DispatchBatchSize {
				break
			}
		}
	}
}

func (d *Dispatcher) poll(ctx context.Context) {
	t := time.NewTicker(d.cfg.dispatchPoll())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.kick()
		}
	}
}

func (d *Dispatcher) retentionLoop(ctx context.Context) {
	if d.cfg.RetentionScanSeconds == 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(time.Duration(d.cfg.RetentionScanSeconds) * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, err := Purge(ctx, d.pool, d.cfg, d.clk)
			if err != nil && ctx.Err() == nil {
				d.log.Warn("events: retention purge failed", "err", err)
				continue
			}
			if n > 0 {
				d.m.purged.Add(float64(n))
				d.log.Info("events: retention purge", "events_deleted", n)
			}
		}
	}
}

// listen turns NOTIFYs on NotifyChannel into wake tokens over a dedicated
// connection; every (re)connect wakes too, since notifications sent while it
// was away are lost.
func (d *Dispatcher) listen(ctx context.Context) {
	l := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.ConnectConfig(ctx, d.pool.Config().ConnConfig.Copy())
		},
		LogError: func(ctx context.Context, err error) {
			if ctx.Err() == nil {
				d.log.Warn("events: LISTEN connection", "err", err)
			}
		},
		ReconnectDelay: min(max(d.cfg.dispatchPoll(), 100*time.Millisecond), 5*time.Second),
	}
	l.Handle(NotifyChannel, dispatchWake{d})
	_ = l.Listen(ctx)
}

type dispatchWake struct{ d *Dispatcher }

func (w dispatchWake) HandleNotification(context.Context, *pgconn.Notification, *pgx.Conn) error {
	w.d.kick()
	return nil
}

func (w dispatchWake) HandleBacklog(context.Context, string, *pgx.Conn) error {
	w.d.kick()
	return nil
}

// sqlClaimDue takes up to $2 due rows: pending or failed whose
// next_attempt_at has come, or dispatching whose lease expired. The CTE is
// MATERIALIZED so the LIMIT holds (a re-run subquery can claim more).
const sqlClaimDue = `
WITH now AS (SELECT coalesce($1::timestamptz, now()) AS t),
due AS MATERIALIZED (
    SELECT event_id FROM event_outbox, now
     WHERE (status IN ('pending', 'failed') AND next_attempt_at <= now.t)
        OR (status = 'dispatching' AND lease_expires_at <= now.t)
     ORDER BY next_attempt_at, event_id
     LIMIT $2
     FOR NO KEY UPDATE SKIP LOCKED)
UPDATE event_outbox o
   SET status = 'dispatching', attempts = o.attempts + 1,
       lease_expires_at = (SELECT t FROM now) + make_interval(secs => $3)
  FROM due
 WHERE o.event_id = due.event_id
RETURNING o.event_id::text, o.event_type, o.aggregate_id, o.payload, o.created_at, o.attempts`

// sqlMarkDispatched records the PubAcks: ids[i] was stored at seqs[i].
const sqlMarkDispatched = `
UPDATE event_outbox o
   SET status = 'dispatched', dispatched_at = coalesce($1::timestamptz, now()),
       lease_expires_at = NULL, stream_seq = a.seq, last_reason = NULL, last_error = NULL
  FROM unnest($2::uuid[], $3::bigint[]) AS a(id, seq)
 WHERE o.event_id = a.id AND o.status = 'dispatching'`

// sqlMarkFailed records a failed publish: failed with a retry time, or
// dead_letter once attempts reached $4.
const sqlMarkFailed = `
UPDATE event_outbox
   SET status = CASE WHEN attempts >= $4::int THEN 'dead_letter' ELSE 'failed' END,
       lease_expires_at = NULL,
       next_attempt_at = coalesce($1::timestamptz, now()) + make_interval(secs => $5::float8),
       dead_lettered_at = CASE WHEN attempts >= $4::int THEN coalesce($1::timestamptz, now()) END,
       last_reason = CASE WHEN attempts >= $4::int THEN 'dispatch_exhausted' ELSE 'publish_failed' END,
       last_error = left($3::text, 500)
 WHERE event_id = $2 AND status = 'dispatching'
RETURNING status`

var errPubAckTimeout = errors.New("no PubAck within the publish timeout")

type claimed struct {
	envelope
	attempts int
}

// DispatchOnce claims one batch of due events, publishes them, waits for
// the PubAcks (AURORA_EVENTS_PUBLISH_TIMEOUT_MS) and records the outcome of
// each: dispatched, failed (retry after backoff) or dead_letter. It returns
// how many rows it claimed. Run calls it; tests call it to step the
// dispatcher. A Postgres error is returned (nothing is lost: claimed rows
// come back after their lease).
func (d *Dispatcher) DispatchOnce(ctx context.Context) (int, error) {
	if d.js.Conn().Status() != nats.CONNECTED {
		return 0, fmt.Errorf("events: dispatch: NATS connection %s", d.js.Conn().Status())
	}
	batch, err := d.claim(ctx)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	type result struct {
		seq uint64
		err error
	}
	results := make([]result, len(batch))
	futures := make([]jetstream.PubAckFuture, len(batch))
	for i, ev := range batch {
		body, err := json.Marshal(ev.envelope)
		if err != nil {
			results[i].err = err
			continue
		}
		msg := &nats.Msg{Subject: Subject(ev.Type), Data: body, Header: nats.Header{}}
		msg.Header.Set("Aurora-Event-Type", ev.Type)
		f, err := d.js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID), jetstream.WithExpectStream(StreamName))
		if err != nil {
			results[i].err = err
			continue
		}
		futures[i] = f
	}
	timeout := time.NewTimer(d.cfg.publishTimeout())
	defer timeout.Stop()
	timedOut := false
	for i, f := range futures {
		if f == nil {
			continue
		}
		if timedOut { // settle what has already arrived, fail the rest
			select {
			case ack := <-f.Ok():
				results[i].seq = ack.Sequence
			case err := <-f.Err():
				results[i].err = err
			default:
				results[i].err = errPubAckTimeout
			}
			continue
		}
		select {
		case ack := <-f.Ok():
			results[i].seq = ack.Sequence
		case err := <-f.Err():
			results[i].err = err
		case <-timeout.C:
			timedOut = true
			results[i].err = errPubAckTimeout
		case <-ctx.Done():
			return len(batch), ctx.Err() // the lease brings the rows back
		}
	}
	var okIDs []string
	var okSeqs []int64
	for i, ev := range batch {
		if results[i].err == nil {
			okIDs = append(okIDs, ev.ID)
			okSeqs = append(okSeqs, int64(results[i].seq))
		}
	}
	if d.afterPublish != nil {
		if err := d.afterPublish(okIDs); err != nil {
			return len(batch), err
		}
	}
	now := d.clk.Override()
	if len(okIDs) > 0 {
		if _, err := d.pool.Exec(ctx, sqlMarkDispatched, now, okIDs, okSeqs); err != nil {
			return len(batch), fmt.Errorf("events: mark dispatched: %w", err)
		}
		d.m.published.Add(float64(len(okIDs)))
	}
	for i, ev := range batch {
		if results[i].err == nil {
			continue
		}
		wait := backoff(d.cfg.DispatchBackoffBaseMS, d.cfg.DispatchBackoffCapMS, ev.attempts)
		var status string
		err := d.pool.QueryRow(ctx, sqlMarkFailed, now, ev.ID, results[i].err.Error(), d.cfg.DispatchMaxAttempts, wait.Seconds()).Scan(&status)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return len(batch), fmt.Errorf("events: mark failed: %w", err)
		}
		d.m.publishFailures.Inc()
		if status == string(StatusDeadLetter) {
			d.m.deadLetters.Inc()
			d.log.Error("events: dispatch dead-lettered", "event_id", ev.ID, "type", ev.Type, "attempts", ev.attempts, "err", results[i].err)
		} else {
			d.log.Warn("events: publish failed, will retry", "event_id", ev.ID, "type", ev.Type, "attempts", ev.attempts, "retry_in", wait, "err", results[i].err)
		}
	}
	return len(batch), nil
}

func (d *Dispatcher) claim(ctx context.Context) ([]claimed, error) {
	rows, err := d.pool.Query(ctx, sqlClaimDue, d.clk.Override(), d.cfg.DispatchBatchSize, d.cfg.dispatchLease().Seconds())
	if err != nil {
		return nil, fmt.Errorf("events: claim: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
		var c claimed
		var payload []byte
		err := r.Scan(&c.ID, &c.Type, &c.AggregateID, &payload, &c.CreatedAt, &c.attempts)
		c.Payload = payload
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("events: claim: %w", err)
	}
	return out, nil
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
