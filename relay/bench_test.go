package relay

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Results and the command that reproduces them: docs/bench-relay.md.
//
//	go test -run '^$' -bench 'RawAsyncPublish|RelayThroughput' -benchtime 100000x ./relay/
//	go test -run '^$' -bench CommitToPublished -benchtime 20000x ./relay/

// BenchmarkRawAsyncPublish is the ceiling: JetStream async publish into the
// AURORA_OUTBOX stream (file store) with a unique Nats-Msg-Id per message and
// at most 1000 unacknowledged, a body the size of the relay's.
func BenchmarkRawAsyncPublish(b *testing.B) {
	_, js := connect(b, natstest.New(b))
	ctx := context.Background()
	if _, err := EnsureStream(ctx, js, DefaultStreamConfig()); err != nil {
		b.Fatal(err)
	}
	key := fmt.Sprintf("%064d", 0)
	msgs := make([]*nats.Msg, b.N)
	for i := range msgs {
		msgs[i] = claimed{id: int64(i + 1), key: key[:54] + fmt.Sprintf("%010d", i), exporter: outbox.DefaultExporter,
			tenant: fmt.Sprintf("org_%d", i%100), dispatch: 1, feature: "api_calls", account: "acct_1"}.message(outbox.PartitionsDefault, "bench")
	}
	// A ring of the last MaxInflightDefault futures: before publishing
	// message i, wait for message i-1000's PubAck (the relay's bound).
	ring := make([]jetstream.PubAckFuture, MaxInflightDefault)
	wait := func(f jetstream.PubAckFuture) {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	startAt := time.Now()
	for i, m := range msgs {
		if f := ring[i%len(ring)]; f != nil {
			wait(f)
		}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			b.Fatal(err)
		}
		ring[i%len(ring)] = f
	}
	for _, f := range ring {
		if f != nil {
			wait(f)
		}
	}
	elapsed := time.Since(startAt)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// stageBulk inserts n due rows in one statement (setup, not measured).
func stageBulk(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox_items (tenant, subject_kind, subject_ref, exporter, destination_account, mode,
			mapping_version, idempotency_key, feature, quantity, occurred_at, period_start, next_attempt_at)
		SELECT 'org_' || (g % 100), 'event', 'usage:api_calls:event:' || g, 'stripe_meter_events', 'acct_1Test', 'test',
			1, '', 'api_calls', 1, now(), date_trunc('day', now()), now() - interval '1 minute'
		FROM generate_series(1, $1::int) g`, n)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox_items`); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRelayThroughput: one relay drains b.N committed rows into
// JetStream; rows/s counts rows marked published (PubAck received, mark
// committed). "defaults" is the documented configuration (4 workers,
// 100-row batches, 1000 in flight); the others vary one knob.
func BenchmarkRelayThroughput(b *testing.B) {
	for _, v := range []struct {
		name           string
		workers, batch int
	}{
		{"defaults", WorkersDefault, 100},
		{"batch=500", WorkersDefault, 500},
		{"workers=2", 2, 100},
	} {
		b.Run(v.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Workers, cfg.Outbox.BatchSize = v.workers, v.batch
			benchmarkThroughput(b, cfg)
		})
	}
}

func benchmarkThroughput(b *testing.B, cfg Config) {
	pool := newPool(b)
	_, js := connect(b, natstest.New(b))
	stageBulk(b, pool, b.N)
	var done atomic.Int64
	all := make(chan struct{})
	hook := withHooks(hooks{afterCommit: func(ids []int64) {
		if done.Add(int64(len(ids))) == int64(b.N) {
			close(all)
		}
	}})
	b.ResetTimer()
	startAt := time.Now()
	run := start(b, pool, js, cfg, hook)
	select {
	case <-all:
	case <-time.After(10 * time.Minute):
		b.Fatalf("only %d of %d rows published", done.Load(), b.N)
	}
	elapsed := time.Since(startAt)
	b.StopTimer()
	if err := run.stop(b); err != nil {
		b.Fatal(err)
	}
	if n, err := streamCount(js); err != nil || n != uint64(b.N) {
		b.Fatalf("stream holds %d messages (err %v), want %d", n, err, b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rows/s")
}

// BenchmarkCommitToPublished: producers commit one row per transaction at
// 1,000 rows/s in total while one relay (default knobs, woken by NOTIFY)
// publishes; latency is from the producer's Commit returning to the relay's
// mark committing (PubAck received). Reports p50, p99 and max in ms.
func BenchmarkCommitToPublished(b *testing.B) {
	pool := newPool(b)
	_, js := connect(b, natstest.New(b))
	ctx := context.Background()
	var (
		mu        sync.Mutex
		committed = make(map[int64]time.Time, b.N)
		published = make(map[int64]time.Time, b.N)
	)
	all := make(chan struct{})
	hook := withHooks(hooks{afterCommit: func(ids []int64) {
		now := time.Now()
		mu.Lock()
		for _, id := range ids {
			published[id] = now
		}
		n := len(published)
		mu.Unlock()
		if n == b.N {
			close(all)
		}
	}})
	run := start(b, pool, js, DefaultConfig(), hook)
	time.Sleep(200 * time.Millisecond) // LISTEN connected, stream ensured
	b.ResetTimer()
	// Open loop: 16 producers, each on its own schedule, 1,000 rows/s in
	// total; many producers so one slow commit (a WAL flush on a busy disk)
	// does not hold the rate down.
	const producers = 16
	interval := time.Duration(producers) * time.Millisecond
	produceStart := time.Now()
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			next := produceStart.Add(time.Duration(p) * time.Millisecond)
			for i := p; i < b.N; i += producers {
				time.Sleep(time.Until(next))
				next = next.Add(interval)
				var id int64
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					row, err := outbox.Stage(ctx, tx, item(fmt.Sprintf("org_%d", p), i))
					id = row.ID
					return err
				})
				at := time.Now()
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				committed[id] = at
				mu.Unlock()
			}
		}(p)
	}
	wg.Wait()
	produced := time.Since(produceStart)
	select {
	case <-all:
	case <-time.After(time.Minute):
		b.Fatal("not every row was published")
	}
	b.StopTimer()
	if err := run.stop(b); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	for id, c := range committed {
		// The mark can commit before the producer records its own commit
		// time (the relay is that fast); that is a latency of ~0.
		lat = append(lat, max(published[id].Sub(c), 0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
	b.ReportMetric(pct(1), "max_ms")
	b.ReportMetric(float64(b.N)/produced.Seconds(), "offered_rows/s")
}
