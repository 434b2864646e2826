package reporter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/reporter"
	"github.com/aurora-billing/aurora/shared/clock"
)

// BenchmarkPass measures a pass that stages one window for each of 1,000
// counters (1,000 tenants × one day), each period its own transaction; then
// the windows are accepted for the next iteration's pass to advance and
// restage. Reported: periods per second.
func BenchmarkPass(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchmarkPass(b, workers) })
	}
}

func benchmarkPass(b *testing.B, workers int) {
	pool := dbtest.New(b)
	ctx := context.Background()
	const counters = 1000
	if _, err := pool.Exec(ctx, `INSERT INTO usage_counters (tenant, feature, period_start, count)
		SELECT 'org_' || g, 'api_calls', $1, 1 FROM generate_series(1, $2) g`, sept1, counters); err != nil {
		b.Fatal(err)
	}
	r := &reporter.Reporter{Pool: pool, Recorder: rec, Clock: clock.NewManual(sept1.Add(time.Hour)), BatchSize: 500, Workers: workers}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := r.Pass(ctx)
		if err != nil || res.Staged != counters {
			b.Fatalf("pass %+v %v", res, err)
		}
		b.StopTimer()
		if _, err := pool.Exec(ctx, `UPDATE outbox_items SET state = 'accepted' WHERE state = 'pending'`); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE usage_counters SET count = count + 1`); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(counters*b.N)/b.Elapsed().Seconds(), "periods/s")
}
