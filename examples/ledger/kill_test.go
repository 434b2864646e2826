package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/events"
	"github.com/jackc/pgx/v5"
)

// childEnv marks the re-executed test binary as the ledger process that
// the parent kills mid-handler.
const childEnv = "LEDGER_TEST_KILL_CHILD"

// TestLedgerChildProcess is the process TestKill9MidHandler kills: the
// ledger with a handler that, after posting its entry and before the
// transaction commits, announces itself in the marker file and hangs.
func TestLedgerChildProcess(t *testing.T) {
	marker := os.Getenv(childEnv)
	if marker == "" {
		t.Skip("run by TestKill9MidHandler")
	}
	var cfg Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	l, err := New(DefaultChart())
	if err != nil {
		t.Fatal(err)
	}
	hang := func(ctx context.Context, tx pgx.Tx, d events.Delivery) error {
		if err := l.Handle(ctx, tx, d); err != nil {
			return err
		}
		if err := os.WriteFile(marker, []byte(d.ID), 0o600); err != nil {
			return err
		}
		select {} // the posting is written, uncommitted: kill -9 lands here
	}
	_ = consume(context.Background(), cfg, "ledger", hang, slog.New(slog.DiscardHandler))
}

// Must show: kill -9 of the consumer mid-handler loses and duplicates
// nothing. The killed process's posting and inbox claim roll back together;
// the event is delivered again to the restarted ledger, which posts every
// event exactly once.
func TestKill9MidHandler(t *testing.T) {
	e := newTestEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := testConfig()
	d, err := events.NewDispatcher(e.pool, e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() { defer wg.Done(); _ = d.Run(ctx) }()

	marker := filepath.Join(t.TempDir(), "in-handler")
	child := exec.Command(os.Args[0], "-test.run=^TestLedgerChildProcess$", "-test.count=1")
	child.Env = append(os.Environ(), childEnv+"="+marker, "AURORA_DATABASE_URL="+e.url, "AURORA_NATS_URL="+e.nats,
		"AURORA_EVENTS_CONSUMER_INTERVAL_MS=100", "AURORA_EVENTS_CONSUMER_ACK_WAIT_SECONDS=1")
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	}()
	eventually(t, 30*time.Second, "the child registered", func() bool {
		return e.count(t, `SELECT count(*) FROM event_consumers WHERE consumer = 'ledger'`) == 1
	})
	for i := range 3 {
		e.publish(t, fmt.Sprintf("in_k%d", i), int64(500+i))
	}
	eventually(t, 30*time.Second, "the child inside its handler, posting written", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	raw, _ := os.ReadFile(marker)
	inFlight := string(raw)
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = child.Wait()
	killed = true
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL", err)
	}
	// Postgres aborts the dead client's transaction: nothing of it stays
	eventually(t, 10*time.Second, "the killed transaction rolled back", func() bool {
		return e.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`) == 0
	})
	if n := e.count(t, `SELECT count(*) FROM ledger_entries WHERE event_id = $1`, inFlight); n != 0 {
		t.Fatalf("the killed handler's posting survived (%d rows)", n)
	}
	if n := e.count(t, `SELECT count(*) FROM event_inbox WHERE event_id = $1 AND status = 'processed'`, inFlight); n != 0 {
		t.Fatal("the killed handler's event is marked processed")
	}

	// the ledger restarted: every event posted exactly once
	t.Setenv("AURORA_DATABASE_URL", e.url)
	t.Setenv("AURORA_NATS_URL", e.nats)
	t.Setenv("AURORA_EVENTS_CONSUMER_INTERVAL_MS", "100")
	t.Setenv("AURORA_EVENTS_CONSUMER_ACK_WAIT_SECONDS", "1")
	rctx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() { done <- run(rctx, nil, os.Stderr) }()
	eventually(t, 30*time.Second, "3 events acknowledged after the restart", func() bool {
		return e.count(t, `SELECT count(*) FROM event_outbox WHERE status = 'acknowledged'`) == 3
	})
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("restarted ledger exit %d", code)
	}
	if n := e.count(t, `SELECT count(*) FROM ledger_entries`); n != 3 {
		t.Fatalf("%d entries, want 3 (one per event)", n)
	}
	if n := e.count(t, `SELECT count(*) FROM ledger_entries WHERE event_id = $1`, inFlight); n != 1 {
		t.Fatalf("the in-flight event posted %d times, want once", n)
	}
	if n := e.count(t, `SELECT count(*) FROM ledger_lines`); n != 6 {
		t.Fatalf("%d lines, want 6", n)
	}
	if n := e.count(t, `SELECT count(*) FROM event_inbox WHERE consumer = 'ledger' AND status = 'processed'`); n != 3 {
		t.Fatalf("%d processed inbox rows, want 3", n)
	}
}
