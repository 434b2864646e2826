package deliverer_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// freezer is a TCP proxy to NATS whose traffic can be held, both ways,
// with the connections kept open: to JetStream the client behind it is
// silent, as a process stopped with SIGSTOP is (nothing is lost; what was
// sent meanwhile arrives on thaw).
type freezer struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target}
	f.cond = sync.NewCond(&f.mu)
	t.Cleanup(func() { f.thaw(); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go f.pipe(c, s)
			go f.pipe(s, c)
		}
	}()
	return f
}

func (f *freezer) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			for f.frozen {
				f.cond.Wait()
			}
			f.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

func (f *freezer) URL() string { return "nats://" + f.ln.Addr().String() }

func (f *freezer) freeze() { f.mu.Lock(); f.frozen = true; f.mu.Unlock() }

func (f *freezer) thaw() {
	f.mu.Lock()
	f.frozen = false
	f.cond.Broadcast()
	f.mu.Unlock()
}

// Must show (handover.go): an owner silent past the pinned TTL loses its
// partition to a standby; once it hears again, it sends nothing more of
// the group it had claimed. d1 owns the lane and is sending a group of 40
// items, one 100 ms call each, when it is "stopped": its NATS traffic
// held (the freezer) and its call held at its front of the emulator. Ten
// more items of the lane are staged meanwhile; past the pinned TTL (1 s)
// JetStream pins the partition to d2 to deliver them, and d1 stays
// stopped until d2 has accepted one. On thaw d1 learns it lost the pin (the refused pull waiting in its
// socket, or its attach check) before its held call returns; it records
// the rest of its group as retries due now with the attempt given back,
// without calling Stripe for them, and the relay's new generations go to
// d2. Every item is accepted once; without the handover d1 would send the
// rest of its group beside d2's calls (429 overlaps and retries).
func TestOwnerSilentPastPinnedTTLHandsItsGroupOver(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{Latency: 100 * time.Millisecond})
	stage := func(prefix string, n int) []outbox.Row {
		rows := make([]outbox.Row, n)
		for i := range rows {
			rows[i] = h.stage(h.item("org_1", fmt.Sprintf("event:%s-%d", prefix, i), 1))
		}
		return rows
	}
	rows := stage("handover", 40)

	// d1's calls go through a front of the emulator that counts them and
	// holds them while d1 is stopped; its NATS connection goes through
	// the freezer.
	var d1Calls atomic.Int64
	var held sync.RWMutex // write-locked while d1 is stopped
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held.RLock()
		held.RUnlock()
		if r.Method == http.MethodPost && r.URL.Path == "/v1/billing/meter_events" {
			d1Calls.Add(1)
		}
		h.srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	fz := newFreezer(t, strings.TrimPrefix(h.nats.URL(), "nats://"))
	nc, err := nats.Connect(fz.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js1, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	exp1, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: front.URL}, 10*time.Second, cfg.Concurrency)
	if err != nil {
		t.Fatal(err)
	}
	opts := []deliverer.Option{deliverer.WithClock(h.clk), deliverer.WithLogger(quietLogger()),
		deliverer.WithLease(time.Minute), deliverer.WithPinnedTTL(time.Second),
		deliverer.WithAttachCheck(100 * time.Millisecond), deliverer.WithJitter(func() float64 { return 0 })}
	reg1 := prometheus.NewRegistry()
	d1, err := deliverer.New(h.pool, js1, exp1, cfg, append(opts, deliverer.WithRegisterer(reg1))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d1.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	h.await("d1 attached", func() bool { return d1.Ready() == nil })
	rc := relay.DefaultConfig()
	rc.PollMS = 20
	h.runRelay(rc)

	// The first item runs alone; the other 39 queue behind it and are
	// claimed as one group.
	h.await("d1 in its group", func() bool { return d1Calls.Load() >= 4 })
	h.start(cfg, opts...) // d2, the standby
	held.Lock()
	fz.freeze()
	more := stage("while-stopped", 10)
	h.await("d2 pinned for the new items", func() bool {
		for _, r := range more {
			if h.get(r.ID).State == outbox.StateAccepted {
				return true
			}
		}
		return false
	})
	fz.thaw()
	time.Sleep(100 * time.Millisecond) // what JetStream sent d1 meanwhile is read first
	atThaw := d1Calls.Load()
	held.Unlock()

	// d2's first call may have overlapped d1's call in flight when it
	// stopped (429, a retry in backoff on the manual clock): let it be due.
	h.await("d1 handed its group over", func() bool { return skipped(reg1, "handed_over") > 0 })
	h.clk.Advance(15 * time.Second)
	// Retries in backoff (a 429 overlap) wait on the manual clock: move it
	// to the next one due whenever nothing else is open.
	h.await("every item accepted", func() bool {
		var open, leased int
		var next *time.Time
		if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE state <> 'accepted'),
			count(*) FILTER (WHERE state = 'leased'), min(next_attempt_at) FILTER (WHERE state = 'pending') FROM outbox_items`).Scan(&open, &leased, &next); err != nil {
			t.Fatal(err)
		}
		if open > 0 && leased == 0 && next != nil && next.After(h.clk.Now()) {
			h.clk.Set(*next)
		}
		return open == 0
	})
	handed := skipped(reg1, "handed_over")
	t.Logf("d1 calls: %d before the thaw, %d after (it may be pinned again); %v handed over; %d overlaps", atThaw, d1Calls.Load()-atThaw, handed, h.emu.Overlaps())
	var over []int64
	hrows, err := h.pool.Query(context.Background(), `SELECT item_id FROM outbox_attempts WHERE error_code = $1 AND lease_token = 1`, deliverer.RuleHandedOver)
	if err != nil {
		t.Fatal(err)
	}
	for hrows.Next() {
		var id int64
		if err := hrows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		over = append(over, id)
	}
	hrows.Close()
	if len(over) == 0 {
		t.Fatal("no attempt row says partition_handed_over")
	}
	for _, id := range over {
		// not sent under the lease it was handed over with: one request in all
		if rs := h.emu.RequestsFor(h.get(id).IdempotencyKey); len(rs) != 1 {
			t.Fatalf("handed-over item %d: %d requests, want 1 (sent once, by its next holder)", id, len(rs))
		}
	}
	if n := h.emu.Overlaps(); n > 1 {
		t.Fatalf("%d overlapping calls, want at most 1 (the call in flight when d1 stopped)", n)
	}
	for _, r := range append(rows, more...) {
		if got := h.emu.Applications(r.IdempotencyKey); got != 1 {
			t.Fatalf("item %d applied %d times", r.ID, got)
		}
	}
	if len(h.emu.DuplicateApplications()) != 0 {
		t.Fatal("duplicate applications")
	}
	var maxAttempts int
	if err := h.pool.QueryRow(context.Background(), `SELECT max(attempts) FROM outbox_items`).Scan(&maxAttempts); err != nil {
		t.Fatal(err)
	}
	if maxAttempts > 2 {
		t.Fatalf("an item spent %d attempts; a handed-over attempt is given back", maxAttempts)
	}
}
