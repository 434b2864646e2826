package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestRelayValidateExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want int
	}{
		{"defaults", nil, 0},
		{"workers out of range", map[string]string{"AURORA_RELAY_WORKERS": "0"}, 2},
		{"poll not a number", map[string]string{"AURORA_RELAY_POLL_MS": "soon"}, 2},
		{"bad http addr", map[string]string{"AURORA_RELAY_HTTP_ADDR": "nowhere"}, 2},
		{"bad nats url", map[string]string{"AURORA_NATS_URL": "http://x"}, 2},
		{"duplicate window too small", map[string]string{"AURORA_OUTBOX_DUPLICATE_WINDOW_SECONDS": "1"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got := run(context.Background(), []string{"relay", "--validate"}); got != tc.want {
				t.Fatalf("exit %d, want %d", got, tc.want)
			}
		})
	}
}

// `aurora relay` end to end: it creates the stream, publishes a committed
// row, and exits 0 when its context ends (SIGTERM).
func TestRelayCommandPublishesAndStopsGracefully(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	srv := natstest.New(t)
	t.Setenv("AURORA_DATABASE_URL", dbURL)
	t.Setenv("AURORA_NATS_URL", srv.URL())
	t.Setenv("AURORA_RELAY_HTTP_ADDR", "127.0.0.1:0")
	t.Setenv("AURORA_RELAY_POLL_MS", "50")

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var id int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		row, err := outbox.Stage(ctx, tx, outbox.Item{
			Identity: identity.Identity{Tenant: "org_cmd", SubjectKind: identity.SubjectEvent, SubjectRef: "usage:api_calls:event:1",
				Exporter: outbox.DefaultExporter, DestinationAccount: "acct_1Test", Mode: identity.ModeTest, MappingVersion: 1},
			Feature: "api_calls", Quantity: 1, OccurredAt: time.Now(), Payload: json.RawMessage(`{}`),
		})
		id = row.ID
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() { done <- run(rctx, []string{"relay"}) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		row, err := outbox.Get(ctx, pool, id)
		if err == nil && row.PublishedDispatch == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("row not published by `aurora relay` (last err %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after graceful stop, want 0", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("aurora relay did not stop")
	}
}
