package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgxlisten"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sethvargo/go-retry"
	"golang.org/x/sync/errgroup"
)

// NotifyChannel is the Postgres channel the outbox_items insert trigger
// NOTIFYs on commit (migrations/sql/00001_export_outbox.sql).
const NotifyChannel = "aurora_outbox"

// Backoff after a failed batch (Postgres or NATS unavailable): exponential
// from BackoffBaseDefault, capped at BackoffCapDefault, ±20 % jitter.
const (
	BackoffBaseDefault = 100 * time.Millisecond
	BackoffCapDefault  = 5 * time.Second
)

// ErrInvalidOption is wrapped by an Option that refuses its arguments.
var ErrInvalidOption = errors.New("relay: invalid option")

// Option adjusts a Relay built by New.
type Option func(*Relay) error

// WithClock sets the clock whose Override is "now" in every SQL decision
// (due, expired lease, re-dispatch interval, backlog age). Default: the
// database clock. Tests pass a *clock.Manual.
func WithClock(c clock.Clock) Option {
	return func(r *Relay) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		r.clk = c
		return nil
	}
}

// WithLogger sets the structured logger (default: slog.Default()). The relay
// logs counts, ids and errors, never payloads, keys or customer ids.
func WithLogger(l *slog.Logger) Option {
	return func(r *Relay) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		r.log = l
		return nil
	}
}

// WithRegistry registers the relay's metrics on reg (see docs/relay.md for
// the series). Without it the relay counts but exports nothing; it never uses
// the global default registry.
func WithRegistry(reg prometheus.Registerer) Option {
	return func(r *Relay) error {
		if reg == nil {
			return fmt.Errorf("%w: nil registry", ErrInvalidOption)
		}
		r.reg = reg
		return nil
	}
}

// WithBackoff sets the backoff after a failed batch: exponential from base,
// capped at max (defaults BackoffBaseDefault, BackoffCapDefault).
func WithBackoff(base, max time.Duration) Option {
	return func(r *Relay) error {
		if base <= 0 || max < base {
			return fmt.Errorf("%w: backoff needs 0 < base <= max, got %s and %s", ErrInvalidOption, base, max)
		}
		r.backoffBase, r.backoffCap = base, max
		return nil
	}
}

// hooks let tests stop the relay at precise points (export_test.go).
type hooks struct {
	// afterPublish runs after a batch's PubAcks arrived and before the rows
	// are marked; an error aborts the batch (rollback) and ends Run with it,
	// like a process killed at that instant.
	afterPublish func(ctx context.Context, ids []int64) error
	// afterCommit runs after a batch's marks committed.
	afterCommit func(ids []int64)
	// afterSweep runs after every re-dispatch sweep with the rows bumped.
	afterSweep func(bumped int)
}

// Relay publishes committed, due outbox rows to the AURORA_OUTBOX stream
// and records what JetStream acknowledged. Any number of relays may run
// against one database: row locks (FOR UPDATE SKIP LOCKED, held until the
// PubAcks are recorded) keep two of them from publishing the same dispatch.
type Relay struct {
	pool *pgxpool.Pool
	js   jetstream.JetStream
	cfg  Config
	clk  clock.Clock
	log  *slog.Logger
	reg  prometheus.Registerer
	m    *metrics

	backoffBase, backoffCap time.Duration
	hooks                   hooks

	// wake holds at most one token: "there may be work". NOTIFY, the poller,
	// the sweep and a worker that found a full batch put one; an idle worker
	// takes it. A token put while every worker is busy is kept, so a commit
	// is never missed.
	wake chan struct{}
	// inflight bounds unacknowledged publishes across workers.
	inflight chan struct{}
	// streamMissing: a publish found no stream for its subject (an operator
	// deleted it); the next batch ensures the stream first.
	streamMissing atomic.Bool
	// started guards Run against a second call.
	started atomic.Bool
	// batchTargets: the subjects batch messages may go to (batchmsg.go).
	batchTargets batchTargets
}

// New returns a relay over pool (the outbox database) and js (a JetStream
// context on a connection the caller owns; give it nats.MaxReconnects(-1) so
// an outage is waited out, and jetstream.WithPublishAsyncMaxPending of at
// least cfg.MaxInflight). cfg is validated (*config.RangeError). A nil pool
// or js returns ErrNilDependency; a bad option ErrInvalidOption; a metric
// already registered on the registry the registry's error.
func New(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, opts ...Option) (*Relay, error) {
	if pool == nil || js == nil {
		return nil, fmt.Errorf("%w: pool and JetStream context are required", ErrNilDependency)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Relay{
		pool: pool, js: js, cfg: cfg,
		clk: clock.DB{}, log: slog.Default(),
		backoffBase: BackoffBaseDefault, backoffCap: BackoffCapDefault,
		wake:     make(chan struct{}, 1),
		inflight: make(chan struct{}, cfg.MaxInflight),
	}
	for _, o := range opts {
		if err := o(r); err != nil {
			return nil, err
		}
	}
	if mc := int(pool.Config().MaxConns); mc < cfg.Workers+1 {
		r.log.Warn("relay: pool smaller than workers + 1; workers and the sweep will queue for connections",
			"max_conns", mc, "workers", cfg.Workers)
	}
	r.m = newMetrics(pool, r.clk, 5*time.Second, r.log, func() float64 { return float64(len(r.inflight)) })
	if r.reg != nil {
		for _, c := range r.m.collectors() {
			if err := r.reg.Register(c); err != nil {
				return nil, fmt.Errorf("relay: register metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Checks are the relay's readiness checks for ops.Handler: Postgres answers
// a ping, the NATS connection is up.
func (r *Relay) Checks() []ops.Check {
	return []ops.Check{
		{Name: "postgres", Fn: func(ctx context.Context) error { return r.pool.Ping(ctx) }},
		{Name: "nats", Fn: func(context.Context) error {
			if s := r.js.Conn().Status(); s != nats.CONNECTED {
				return fmt.Errorf("relay: nats %s", s)
			}
			return nil
		}},
	}
}

// Run reads the outbox database's identity (outbox.DatabaseID, stamped on
// the stream and every message), ensures the stream (retrying while
// Postgres or NATS is unreachable), then publishes until ctx ends. It returns nil after a graceful stop: the
// batches in progress finish (PubAcks awaited, marks committed) before it
// returns. It returns an error wrapping ErrStreamConfig when JetStream
// refuses the stream configuration, one wrapping ErrForeignStream when the
// stream belongs to another outbox database, and ErrAlreadyRun on a second
// call.
// Postgres or NATS outages never end Run: the relay backs off and retries,
// losing nothing.
func (r *Relay) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return ErrAlreadyRun
	}
	if err := r.resolveDatabase(ctx); err != nil {
		return nil // ctx ended
	}
	if err := r.ensureStream(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.log.Info("relay: running", "workers", r.cfg.Workers, "batch_size", r.cfg.Outbox.BatchSize, "batch_message_items", r.cfg.BatchMessageItems,
		"max_inflight", r.cfg.MaxInflight, "poll_ms", r.cfg.PollMS, "redispatch_seconds", r.cfg.RedispatchSeconds)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { r.listen(gctx); return nil })
	g.Go(func() error { r.poll(gctx); return nil })
	g.Go(func() error { r.sweepLoop(gctx); return nil })
	for i := 0; i < r.cfg.Workers; i++ {
		g.Go(func() error { return r.work(gctx) })
	}
	r.kick() // rows committed before we started
	err := g.Wait()
	r.log.Info("relay: stopped")
	return err
}

// kick puts the wake token unless one is already waiting.
func (r *Relay) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Relay) newBackoff() retry.Backoff {
	return retry.WithCappedDuration(r.backoffCap, retry.WithJitterPercent(20, retry.NewExponential(r.backoffBase)))
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

// resolveDatabase sets cfg.Stream.Database to the pool's outbox.DatabaseID,
// retrying while Postgres does not answer; it returns ctx's error when ctx
// ends first.
func (r *Relay) resolveDatabase(ctx context.Context) error {
	bo := r.newBackoff()
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		id, err := outbox.DatabaseID(qctx, r.pool)
		cancel()
		if err == nil {
			r.cfg.Stream.Database = id
			return nil
		}
		d, _ := bo.Next()
		r.log.Warn("relay: database not reachable yet, retrying", "err", err, "retry_in", d)
		if !sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

// ensureStream runs EnsureStream until it succeeds, ctx ends, or JetStream
// refuses the configuration (ErrStreamConfig or ErrForeignStream, returned).
func (r *Relay) ensureStream(ctx context.Context) error {
	bo := r.newBackoff()
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := EnsureStream(actx, r.js, r.cfg.Stream)
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrStreamConfig) || errors.Is(err, ErrForeignStream) {
			return err
		}
		d, _ := bo.Next()
		r.log.Warn("relay: stream not ensured yet, retrying", "err", err, "retry_in", d)
		if !sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

// work is one batch worker: it waits for a wake token, then publishes
// batches until one comes back short. A failed batch backs off and retries.
func (r *Relay) work(ctx context.Context) error {
	bo := r.newBackoff()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		}
		for ctx.Err() == nil {
			n, err := r.batch(ctx)
			var fatal *fatalError
			if errors.As(err, &fatal) {
				return fatal.err
			}
			if err != nil {
				r.m.batchErrors.Inc()
				d, _ := bo.Next()
				r.log.Warn("relay: batch failed, backing off", "err", err, "rows", n, "retry_in", d)
				if !sleep(ctx, d) {
					return nil
				}
				continue
			}
			bo = r.newBackoff()
			if n < r.cfg.Outbox.BatchSize {
				break
			}
			r.kick() // a full batch: more may be waiting, let an idle peer help
		}
	}
}

// fatalError ends Run (only a test hook produces one).
type fatalError struct{ err error }

func (f *fatalError) Error() string { return f.err.Error() }
func (f *fatalError) Unwrap() error { return f.err }

// poll is the fallback when no NOTIFY arrives: rows that became due by time
// (a retry's next_attempt_at, an expired lease) and notifications lost while
// the LISTEN connection was down.
func (r *Relay) poll(ctx context.Context) {
	t := time.NewTicker(r.cfg.poll())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.kick()
		}
	}
}

// listen holds a dedicated LISTEN connection (not from the pool) and turns
// every notification on NotifyChannel into a wake token; it reconnects after
// losing the connection and wakes the workers on every (re)connect, since
// notifications sent while it was away are lost.
func (r *Relay) listen(ctx context.Context) {
	delay := min(max(r.cfg.poll(), 100*time.Millisecond), 5*time.Second)
	l := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
		},
		LogError: func(ctx context.Context, err error) {
			if ctx.Err() == nil {
				r.log.Warn("relay: LISTEN connection", "err", err)
			}
		},
		ReconnectDelay: delay,
	}
	l.Handle(NotifyChannel, wakeHandler{r})
	_ = l.Listen(ctx) // returns only when ctx ends
}

type wakeHandler struct{ r *Relay }

func (h wakeHandler) HandleNotification(context.Context, *pgconn.Notification, *pgx.Conn) error {
	h.r.kick()
	return nil
}

func (h wakeHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.r.kick()
	return nil
}
