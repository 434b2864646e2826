package main

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestDelivererValidateExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want int
	}{
		{"defaults with a test key", map[string]string{"AURORA_STRIPE_API_KEY": "sk_test_x"}, 0},
		{"no key", map[string]string{"AURORA_STRIPE_API_KEY": ""}, 2},
		{"publishable key", map[string]string{"AURORA_STRIPE_API_KEY": "pk_test_x"}, 2},
		{"concurrency out of range", map[string]string{"AURORA_STRIPE_API_KEY": "sk_test_x", "AURORA_DELIVERER_CONCURRENCY": "0"}, 2},
		{"timeout not below lease", map[string]string{"AURORA_STRIPE_API_KEY": "sk_test_x", "AURORA_STRIPE_TIMEOUT_SECONDS": "120"}, 2},
		{"bad base url", map[string]string{"AURORA_STRIPE_API_KEY": "sk_test_x", "AURORA_STRIPE_API_BASE": "api.stripe.com"}, 2},
		{"bad http addr", map[string]string{"AURORA_STRIPE_API_KEY": "sk_test_x", "AURORA_DELIVERER_HTTP_ADDR": "nowhere"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got := run(context.Background(), []string{"deliverer", "--validate"}); got != tc.want {
				t.Fatalf("exit %d, want %d", got, tc.want)
			}
		})
	}
}

// `aurora deliverer` end to end against the emulator: a published item is
// accepted, and the command exits 0 when its context ends (SIGTERM).
func TestDelivererCommandDeliversAndStops(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	srv := natstest.New(t)
	emu, err := stripeemulator.New(stripeemulator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	meter, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: "api_calls"})
	if err != nil {
		t.Fatal(err)
	}
	if err := emu.AddCustomer("cus_cmd"); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(emu)
	defer hs.Close()
	t.Setenv("AURORA_DATABASE_URL", dbURL)
	t.Setenv("AURORA_NATS_URL", srv.URL())
	t.Setenv("AURORA_STRIPE_API_KEY", "sk_test_cmd")
	t.Setenv("AURORA_STRIPE_API_BASE", hs.URL)
	t.Setenv("AURORA_DELIVERER_HTTP_ADDR", "127.0.0.1:0")

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, q := range []string{
		`INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ('acct_cmd', 'test', true)`,
		`INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name) VALUES ('acct_cmd', 'api_calls', '` + meter.ID + `', 'api_calls')`,
		`INSERT INTO tenant_billing (tenant, destination_account, stripe_customer) VALUES ('org_cmd', 'acct_cmd', 'cus_cmd')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var row outbox.Row
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		row, err = outbox.Stage(ctx, tx, outbox.Item{
			Identity: identity.Identity{Tenant: "org_cmd", SubjectKind: identity.SubjectEvent, SubjectRef: "event:cmd1",
				Exporter: outbox.DefaultExporter, DestinationAccount: "acct_cmd", Mode: identity.ModeTest, MappingVersion: 1},
			Feature: "api_calls", Quantity: 2, OccurredAt: time.Now().Add(-time.Minute),
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := relay.EnsureStream(ctx, js, relay.DefaultStreamConfig()); err != nil {
		t.Fatal(err)
	}
	msg := outbox.Message{ItemID: row.ID, Key: row.IdempotencyKey, Dispatch: row.Dispatch}
	if _, err := js.Publish(ctx, outbox.PartitionSubject(row.Exporter, row.Tenant, 0), msg.Encode(), jetstream.WithMsgID(outbox.MsgID(row.IdempotencyKey, row.Dispatch))); err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() { done <- run(runCtx, []string{"deliverer"}) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := outbox.Get(ctx, pool, row.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == outbox.StateAccepted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("item still %s", got.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("deliverer did not stop")
	}
	if emu.Applications(row.IdempotencyKey) != 1 {
		t.Fatal("not applied once")
	}
}
