package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// newPool returns a pool on a fresh migrated database, large enough for 50
// concurrent writers beside the relays' workers (pgxpool's default, 4 on
// this machine, would serialise them).
func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 80
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// withHooks installs test hooks.
func withHooks(h hooks) Option {
	return func(r *Relay) error { r.hooks = h; return nil }
}

// testConfig is DefaultConfig with tiny intervals, so tests wait on
// conditions for milliseconds, never for real intervals.
func testConfig() Config {
	c := DefaultConfig()
	c.PollMS = 20
	c.RedispatchScanMS = 20
	c.PublishTimeoutMS = 10000 // generous: a loaded 2-core machine must not turn slow PubAcks into republishes
	return c
}

func quietLogger() *slog.Logger {
	if os.Getenv("RELAY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// item returns a valid outbox item whose identity is unique per (tenant, n).
func item(tenant string, n int) outbox.Item {
	return outbox.Item{
		Identity: identity.Identity{
			Tenant: tenant, SubjectKind: identity.SubjectEvent,
			SubjectRef: fmt.Sprintf("usage:api_calls:event:%d", n), Exporter: outbox.DefaultExporter,
			DestinationAccount: "acct_1Test", Mode: identity.ModeTest, MappingVersion: 1,
		},
		Feature: "api_calls", Quantity: int64(n + 1),
		OccurredAt: time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC),
		Payload:    json.RawMessage(`{}`),
	}
}

// stage commits items, each in its own transaction, and returns their ids.
func stage(t testing.TB, pool *pgxpool.Pool, items ...outbox.Item) []int64 {
	t.Helper()
	ids := make([]int64, 0, len(items))
	for _, it := range items {
		err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			row, err := outbox.Stage(context.Background(), tx, it)
			ids = append(ids, row.ID)
			return err
		})
		if err != nil {
			t.Fatalf("stage: %v", err)
		}
	}
	return ids
}

func items(tenant string, from, n int) []outbox.Item {
	out := make([]outbox.Item, n)
	for i := range out {
		out[i] = item(tenant, from+i)
	}
	return out
}

// connect returns a JetStream context on srv that reconnects forever.
func connect(t testing.TB, srv *natstest.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectBufSize(64<<20),
		nats.ReconnectHandler(func(*nats.Conn) { quietLogger().Info("test: nats reconnected") }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { quietLogger().Info("test: nats disconnected", "err", err) }))
	if err != nil {
		t.Fatalf("nats: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(10000), jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// running is a relay started in the background.
type running struct {
	r      *Relay
	cancel context.CancelFunc
	done   chan error
}

func start(t testing.TB, pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, opts ...Option) *running {
	t.Helper()
	opts = append([]Option{WithLogger(quietLogger()), WithBackoff(20*time.Millisecond, 200*time.Millisecond)}, opts...)
	r, err := New(pool, js, cfg, opts...)
	if err != nil {
		t.Fatalf("relay.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- r.Run(ctx) }()
	t.Cleanup(func() { run.stop(t) })
	return run
}

// stop cancels the relay and returns Run's result (once; later calls nil).
func (run *running) stop(t testing.TB) error {
	t.Helper()
	run.cancel()
	select {
	case err, ok := <-run.done:
		if ok {
			close(run.done)
			return err
		}
		return nil
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop within 30s")
		return nil
	}
}

// eventually polls cond until it holds or 30 s pass.
func eventually(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s (last error: %v)", what, lastErr)
}

// publishedCount counts rows whose current dispatch is marked published.
func publishedCount(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_items WHERE published_dispatch = dispatch`).Scan(&n)
	return n, err
}

// storedMsg is a message held by the stream.
type storedMsg struct {
	subject string
	msgID   string
	body    outbox.Message
}

// streamMsgs reads every message the AURORA_OUTBOX stream holds.
func streamMsgs(t testing.TB, js jetstream.JetStream) []storedMsg {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, outbox.StreamName)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	var out []storedMsg
	if info.State.Msgs == 0 {
		return nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get msg %d: %v", seq, err)
		}
		body, err := outbox.DecodeMessage(m.Data)
		if err != nil {
			t.Fatalf("msg %d: %v", seq, err)
		}
		out = append(out, storedMsg{subject: m.Subject, msgID: m.Header.Get(jetstream.MsgIDHeader), body: body})
	}
	return out
}

func streamCount(js jetstream.JetStream) (uint64, error) {
	s, err := js.Stream(context.Background(), outbox.StreamName)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(context.Background())
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// wire counts every message published on the outbox subjects, as a core
// NATS subscriber sees them: before JetStream's duplicate filter, so a
// second publish of one Nats-Msg-Id shows here even when the stream drops it.
type wire struct {
	mu    sync.Mutex
	byID  map[string]int
	total int
}

func tap(t testing.TB, nc *nats.Conn) *wire {
	t.Helper()
	w := &wire{byID: map[string]int{}}
	sub, err := nc.Subscribe(outbox.SubjectPrefix+".>", func(m *nats.Msg) {
		w.mu.Lock()
		w.byID[m.Header.Get(jetstream.MsgIDHeader)]++
		w.total++
		w.mu.Unlock()
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return w
}

func (w *wire) snapshot() (map[string]int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := make(map[string]int, len(w.byID))
	for k, v := range w.byID {
		m[k] = v
	}
	return m, w.total
}
