package events

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BenchmarkPublishToProcessed measures domain events end to end for one
// consumer: b.N events committed by a producer (100 per transaction,
// events.Publish each), dispatched to AURORA_EVENTS by one Dispatcher and
// processed by one consumer (real-time and catch-up, the handler one
// INSERT in the claim's transaction), all in this process. It reports
// events/s from the first commit to the last processed inbox row, with
// the default knobs. Run it beside ../shared/bench/pgclaim/run (BENCHMARKS.md):
//
//	go test -run '^$' -bench PublishToProcessed -benchtime 20000x ./shared/events/
func BenchmarkPublishToProcessed(b *testing.B) {
	e := newEnv(b)
	e.effectsTable()
	ctx := context.Background()
	cfg := DefaultConfig()
	stopD := run(b, e.dispatcher(cfg).Run)
	c := e.client(cfg)
	stopC := run(b, func(ctx context.Context) error {
		return c.Consume(ctx, "bench", []string{"InvoicePaid.v1"}, recordEffect("bench"))
	})
	eventually(b, 20*time.Second, "consumer registered", func() bool {
		return e.count(`SELECT count(*) FROM event_consumers`) == 1
	})
	if _, err := EnsureStream(ctx, e.js, cfg); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	const perTx = 100
	for i := 0; i < b.N; i += perTx {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			for j := i; j < min(i+perTx, b.N); j++ {
				if _, err := Publish(ctx, tx, Event{Type: "InvoicePaid.v1", AggregateID: fmt.Sprintf("in_%d", j),
					Payload: json.RawMessage(fmt.Sprintf(`{"amount": %d, "currency": "eur"}`, j))}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	committed := time.Since(start)
	for e.count(`SELECT count(*) FROM event_inbox WHERE consumer = 'bench' AND status = 'processed'`) < b.N {
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	stopC()
	stopD()
	if n := e.count(`SELECT count(*) FROM effects`); n != b.N {
		b.Fatalf("%d side effects for %d events", n, b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(b.N)/committed.Seconds(), "published/s")
	b.ReportMetric(0, "ns/op")
}
