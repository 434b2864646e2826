// Package pipelinetest runs the export pipeline for a test in one line: a
// fresh migrated database (migrations/dbtest), an embedded JetStream
// (shared/natstest), the Stripe emulator on a loopback port, one relay and
// one deliverer, all stopped when the test ends. Tests use it to check
// what reaches the provider end to end (the SQL API from other languages,
// restaging, auroractl's usage commands).
package pipelinetest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/provision"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stripe/stripe-go/v76/client"
)

// Account is the destination account every Pipeline provisions (confirmed,
// test mode).
const Account = "acct_pipelinetest"

// Key is the emulator API key the pipeline sends with.
const Key = "sk_test_pipelinetest"

// Pipeline is a database with a running relay and deliverer in front of
// the emulator.
type Pipeline struct {
	t           testing.TB
	DatabaseURL string
	Pool        *pgxpool.Pool
	Emulator    *stripeemulator.Emulator
	API         *client.API // stripe-go against the emulator, for package provision
	APIBase     string      // the emulator's base URL
}

// New returns a provisioned account on a fresh database and the emulator;
// the relay and deliverer start with Start.
func New(t testing.TB) *Pipeline {
	t.Helper()
	ctx := context.Background()
	dbURL := dbtest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	emu, err := stripeemulator.New(stripeemulator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: emu, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln) //nolint:errcheck // closed at cleanup
	t.Cleanup(func() { hs.Close() })
	base := "http://" + ln.Addr().String()
	if err := provision.Account(ctx, pool, Account, identity.ModeTest, true); err != nil {
		t.Fatal(err)
	}
	return &Pipeline{t: t, DatabaseURL: dbURL, Pool: pool, Emulator: emu, API: provision.NewAPI(Key, base, nil), APIBase: base}
}

// Start runs a relay and a deliverer until the test ends.
func (p *Pipeline) Start() {
	t := p.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv := natstest.New(t)
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.EnsureStream(ctx, js, relay.DefaultStreamConfig()); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rcfg := relay.DefaultConfig()
	rcfg.PollMS, rcfg.Workers = 20, 2
	rl, err := relay.New(p.Pool, js, rcfg, relay.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	exp, err := stripeexport.New(stripeexport.Config{APIKey: Key, APIBase: p.APIBase}, 10*time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	dcfg := deliverer.DefaultConfig()
	dcfg.Concurrency, dcfg.BusyDelayMillis, dcfg.ShutdownSeconds = 8, 20, 10
	dl, err := deliverer.New(p.Pool, js, exp, dcfg, deliverer.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	// The deliverer's consumer first, then the relay (the embedded server
	// races a stream update against a concurrent consumer creation).
	done := make(chan error, 2)
	go func() { done <- dl.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if dl.Ready() == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pipelinetest: the deliverer's partition consumers did not appear")
		}
		time.Sleep(10 * time.Millisecond)
	}
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil && ctx.Err() == nil {
				t.Errorf("pipelinetest: %v", err)
			}
		}
		nc.Close()
	})
}

// Settle waits (up to 60 s, polling) until no item is pending or leased.
func (p *Pipeline) Settle() {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var open int
		if err := p.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_items WHERE state IN ('pending', 'leased')`).Scan(&open); err != nil {
			p.t.Fatal(err)
		}
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("pipelinetest: %d items still pending or leased after 60 s", open)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Meter creates a meter for feature at the emulator and maps it.
func (p *Pipeline) Meter(feature string) provision.Mapping {
	p.t.Helper()
	m, err := provision.Meter(context.Background(), p.Pool, p.API, Account, feature, "aurora_"+feature)
	if err != nil {
		p.t.Fatal(err)
	}
	return m
}

// Customer creates the tenant's customer at the emulator and maps it.
func (p *Pipeline) Customer(tenant string) {
	p.t.Helper()
	if _, _, err := provision.Customer(context.Background(), p.Pool, p.API, Account, tenant); err != nil {
		p.t.Fatal(err)
	}
}
