package events

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// env is one test's database, JetStream and log capture.
type env struct {
	t    testing.TB
	pool *pgxpool.Pool
	srv  *natstest.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	logs *logCapture
	log  *slog.Logger
}

func newEnv(t testing.TB) *env {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 30
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	srv := natstest.New(t)
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	lc := &logCapture{}
	var h slog.Handler = lc
	if os.Getenv("EVENTS_TEST_LOG") != "" {
		h = teeHandler{lc, slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})}
	}
	return &env{t: t, pool: pool, srv: srv, nc: nc, js: js, logs: lc, log: slog.New(h)}
}

// testConfig is DefaultConfig with short intervals, so tests wait on
// conditions for milliseconds.
func testConfig() Config {
	c := DefaultConfig()
	c.ConsumerIntervalMS = 200
	c.DispatchPollMS = 20
	c.ConsumerBackoffBaseMS = 10
	c.ConsumerBackoffCapMS = 40
	c.ConsumerMaxAttempts = 3
	c.ConsumerMaxDeliver = 10
	c.DispatchBackoffBaseMS = 10
	c.DispatchBackoffCapMS = 40
	return c
}

func (e *env) dispatcher(cfg Config, opts ...Option) *Dispatcher {
	e.t.Helper()
	d, err := NewDispatcher(e.pool, e.js, cfg, append([]Option{WithLogger(e.log)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

func (e *env) client(cfg Config, opts ...Option) *Client {
	e.t.Helper()
	c, err := NewClient(e.pool, e.js, cfg, append([]Option{WithLogger(e.log)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// run starts fn in the background; the returned stop cancels it and waits.
func run(t testing.TB, fn func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("run: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("run: did not stop within 20s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// publish commits n events of typ, each in its own transaction, and
// returns their ids.
func (e *env) publish(typ string, n int) []string {
	e.t.Helper()
	ids := make([]string, n)
	for i := range n {
		tx, err := e.pool.Begin(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		id, err := Publish(context.Background(), tx, Event{Type: typ, AggregateID: fmt.Sprintf("agg-%d", i),
			Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, i))})
		if err != nil {
			e.t.Fatal(err)
		}
		if err := tx.Commit(context.Background()); err != nil {
			e.t.Fatal(err)
		}
		ids[i] = id
	}
	return ids
}

// eventually polls cond every 10 ms until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) statuses() map[Status]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT status, count(*) FROM event_outbox GROUP BY status`)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[Status]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			e.t.Fatal(err)
		}
		out[Status(s)] = n
	}
	return out
}

// effects is a handler's side-effect table: one row per (consumer, event)
// application, with no unique key, so a second application shows.
func (e *env) effectsTable() {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE effects (consumer text NOT NULL, event_id uuid NOT NULL)`); err != nil {
		e.t.Fatal(err)
	}
}

func recordEffect(consumer string) Handler {
	return func(ctx context.Context, tx pgx.Tx, d Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, event_id) VALUES ($1, $2)`, consumer, d.ID)
		return err
	}
}

// logCapture keeps every record at Warn or above.
type logCapture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logCapture) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelDebug }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCapture) WithGroup(string) slog.Handler      { return l }

// atLeast returns the messages of records at level lv or above.
func (l *logCapture) atLeast(lv slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.recs {
		if r.Level >= lv {
			out = append(out, r.Message)
		}
	}
	return out
}

type teeHandler struct{ a, b slog.Handler }

func (t teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return t.a.Enabled(ctx, l) || t.b.Enabled(ctx, l)
}
func (t teeHandler) Handle(ctx context.Context, r slog.Record) error {
	_ = t.a.Handle(ctx, r)
	return t.b.Handle(ctx, r)
}
func (t teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{t.a.WithAttrs(as), t.b.WithAttrs(as)}
}
func (t teeHandler) WithGroup(n string) slog.Handler {
	return teeHandler{t.a.WithGroup(n), t.b.WithGroup(n)}
}
