package reconcilertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/streamexport"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Must show: a stream batch of 100 events, one of which the emulator
// rejects asynchronously (its customer is unknown to Stripe: the request is
// answered 200 {} and the rejection is only in a meter error report). The
// whole pipeline runs: real Postgres, the relay and a deliverer on an
// embedded JetStream, the v2 stream exporter, the emulator, the inbox and
// the reconciler. Every item is accepted at first (a 200 accepts the whole
// batch); the reconciler then finds exactly that one item as
// async_rejection, leaves it accepted and unconfirmed, and confirms the
// other 99. The only other finding is the settled summary window of the
// rejected event's own customer, short by its quantity, which names only
// that item too.
func TestMustShowStreamBatchWithOneAsyncRejection(t *testing.T) {
	// The clock starts ahead of the database's now(), so rows the database
	// timestamps are due on it; the items occur in the hour before.
	start := time.Now().UTC().Truncate(time.Hour).Add(2 * time.Hour)
	h := New(t, Options{Start: start, SettleLag: 10 * time.Minute, AsyncValidation: true})
	h.Exec(`UPDATE stripe_accounts SET exporter = 'stream' WHERE account_id = $1`, Account)
	at := start.Add(-30 * time.Minute)
	// 100 lanes of one item each, so the deliverer has 100 units at once
	// for the exporter to pack into one request.
	var good []int64
	for i := range 99 {
		tenant, cus := fmt.Sprintf("t%02d", i), fmt.Sprintf("cus_%02d", i)
		h.Customer(tenant, cus, true)
		id, _ := h.Item(tenant, "api_calls", Ref(i), int64(i%5+1), at)
		good = append(good, id)
	}
	h.Customer("ghost", "cus_unknown", false) // Stripe does not know it
	bad, badKey := h.Item("ghost", "api_calls", Ref(999), 3, at)

	ns := natstest.New(t)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(h.Ctx)
	var done []chan struct{}
	t.Cleanup(func() {
		cancel()
		for _, d := range done {
			<-d
		}
	})
	run := func(f func(context.Context) error) {
		d := make(chan struct{})
		done = append(done, d)
		go func() { defer close(d); _ = f(ctx) }()
	}
	// One partition: the relay publishes the 100 items before the deliverer
	// starts, and its one partition consumer pulls them in one go, so their
	// 100 lanes reach the exporter within its linger.
	rcfg := relay.DefaultConfig()
	rcfg.PollMS = 20
	rcfg.Stream.Partitions = 1
	rl, err := relay.New(h.Pool, js, rcfg, relay.WithClock(h.Clock), relay.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	run(rl.Run)
	await(t, "100 items published", func() bool {
		return h.Count(`SELECT count(*) FROM outbox_items WHERE published_dispatch = dispatch`) == 100
	})
	v1, err := stripeexport.New(stripeexport.Config{APIKey: APIKey, APIBase: h.APIBase}, 10*time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	st, err := streamexport.New(streamexport.Config{Client: streamexport.ClientConfig{APIKey: APIKey, APIBase: h.APIBase,
		Timeout: 10 * time.Second, Now: h.Clock.Now}, Linger: streamexport.MaxLinger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	d, err := deliverer.New(h.Pool, js, streamexport.Router{V1: v1, Stream: st}, deliverer.DefaultConfig(),
		deliverer.WithClock(h.Clock), deliverer.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	run(d.Run)
	await(t, "100 items accepted", func() bool {
		return h.Count(`SELECT count(*) FROM outbox_items WHERE state = 'accepted'`) == 100
	})

	// One request carried the 100 events: 200 {}, and every event of it
	// accepted, the rejected one included.
	var batch []string
	streams := 0
	for _, rr := range h.Emu.Requests() {
		if rr.Route != stripeemulator.RouteMeterEventStream {
			continue
		}
		streams++
		if slices.Contains(rr.Identifiers, badKey) {
			if rr.Status != 200 {
				t.Fatalf("the rejected event's request answered %d", rr.Status)
			}
			batch = rr.Identifiers
		}
	}
	if streams != 1 || len(batch) != 100 {
		t.Fatalf("%d stream requests; the rejected event's carried %d events, want one request of all 100", streams, len(batch))
	}
	if n := h.Emu.AppliedCount(); n != 99 {
		t.Fatalf("emulator applied %d events, want the 99 good ones", n)
	}
	reports := h.Emu.ErrorReports()
	if len(reports) != 1 || reports[0].Identifier != badKey {
		t.Fatalf("error reports %+v, want one for the rejected event", reports)
	}

	if ids := h.FlushReports(); len(ids) != 1 {
		t.Fatalf("thin events %v, want one meter error report", ids)
	}
	h.Clock.Set(start.Add(15 * time.Minute)) // the items' hour is settled
	rep := h.Run()
	open := h.Open()
	var rejections []reconciler.Item
	for _, it := range open {
		switch it.Kind {
		case reconciler.KindAsyncRejection:
			rejections = append(rejections, it)
		case reconciler.KindSummaryShortfall:
			if !slices.Equal(it.ItemIDs, []int64{bad}) {
				t.Fatalf("shortfall names %v, want only the rejected item %d", it.ItemIDs, bad)
			}
		default:
			t.Fatalf("unexpected finding %s: %+v", it.Kind, it)
		}
	}
	if len(rejections) != 1 || !slices.Equal(rejections[0].ItemIDs, []int64{bad}) {
		t.Fatalf("async_rejection items %+v, want exactly one naming item %d", rejections, bad)
	}
	if rep.ItemsConfirmed != 99 {
		t.Fatalf("confirmed %d, want 99 (%+v)", rep.ItemsConfirmed, rep)
	}
	if n := h.Count(`SELECT count(*) FROM outbox_items WHERE id = ANY($1) AND state = 'confirmed'`, good); n != 99 {
		t.Fatalf("%d of the 99 good items confirmed", n)
	}
	if got := h.States(); got["confirmed"] != 99 || got["accepted"] != 1 {
		t.Fatalf("states %v, want 99 confirmed and the rejected one still accepted", got)
	}
	var state string
	if err := h.Pool.QueryRow(h.Ctx, `SELECT state FROM outbox_items WHERE id = $1`, bad).Scan(&state); err != nil || state != "accepted" {
		t.Fatalf("rejected item %s (%v), want accepted (never confirmed)", state, err)
	}
}

// await polls cond until it holds or 30 s pass.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
