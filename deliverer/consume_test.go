package deliverer_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// gauge returns the value of the unlabelled gauge name in reg (-1 when
// absent).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// readyz is the status /readyz answers for r.
func readyz(r *running) int {
	rec := httptest.NewRecorder()
	ops.Handler(r.reg, r.d.Checks()...).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	return rec.Code
}

// reattachGate holds every re-attach of a stopped consume loop until
// released, recording which partitions waited.
type reattachGate struct {
	mu      sync.Mutex
	waited  []int
	release chan struct{}
}

func newReattachGate() *reattachGate { return &reattachGate{release: make(chan struct{})} }

func (g *reattachGate) option() deliverer.Option {
	return deliverer.WithBeforeReattach(func(ctx context.Context, p int) {
		g.mu.Lock()
		g.waited = append(g.waited, p)
		g.mu.Unlock()
		select {
		case <-g.release:
		case <-ctx.Done():
		}
	})
}

func (g *reattachGate) partitions() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Sorted(slices.Values(g.waited))
}

// deleteConsumer deletes a partition consumer as `nats consumer rm` does.
func (h *harness) deleteConsumer(name string) {
	h.t.Helper()
	if err := h.js.DeleteConsumer(context.Background(), outbox.StreamName, name); err != nil {
		h.t.Fatalf("delete %s: %v", name, err)
	}
}

// A consume loop that ends by itself is noticed at once, not at the next
// attach check (an hour here): JetStream tells the waiting pull that its
// consumer was deleted. While it is down the deliverer is not ready, its
// gauge is 0; it recreates the consumer and delivers again.
func TestConsumeLoopEndNoticed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	gate := newReattachGate()
	r := h.start(testConfig(), deliverer.WithAttachCheck(time.Hour), gate.option())
	if v := gauge(t, r.reg, "aurora_deliverer_consume_loop_running"); v != 1 || readyz(r) != http.StatusOK {
		t.Fatalf("attached: gauge %v, readyz %d", v, readyz(r))
	}
	row := h.stage(h.item("org_1", "event:rm", 1))
	_, msg := laneMessage(t, h.pool, row)
	p := outbox.Partition(msg.Lane, outbox.PartitionsDefault)

	h.deleteConsumer(r.d.ConsumerName(p))
	h.await("the ended loop noticed", func() bool { return len(gate.partitions()) == 1 })
	if got := gate.partitions(); got[0] != p {
		t.Fatalf("re-attach of partition %v, want %d", got, p)
	}
	if r.d.Ready() == nil || readyz(r) != http.StatusServiceUnavailable {
		t.Fatalf("ready while partition %d has no consume loop (readyz %d)", p, readyz(r))
	}
	if v := gauge(t, r.reg, "aurora_deliverer_consume_loop_running"); v != 0 {
		t.Fatalf("consume_loop_running %v while down", v)
	}
	h.publish(row.ID) // committed while the consumer is gone: kept by the stream
	close(gate.release)
	h.await("ready again", func() bool { return r.d.Ready() == nil })
	if v := gauge(t, r.reg, "aurora_deliverer_consume_loop_running"); v != 1 || readyz(r) != http.StatusOK {
		t.Fatalf("re-attached: gauge %v, readyz %d", v, readyz(r))
	}
	h.awaitState(row.ID, outbox.StateAccepted)
}

// Must show: `nats consumer rm` of the deliverers' consumers under load.
// Every partition consumer is deleted while items are in flight and more
// are committed; /readyz answers 503 while the loops are down; delivery
// resumes by itself; every item is accepted and applied exactly once.
func TestConsumerDeletedUnderLoad(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{Latency: 5 * time.Millisecond})
	const tenants = 8
	for i := range tenants {
		h.addTenant(fmt.Sprintf("org_c%d", i), fmt.Sprintf("cus_c%d", i))
	}
	gate := newReattachGate()
	cfg := testConfig()
	r := h.start(cfg, deliverer.WithAttachCheck(100*time.Millisecond), gate.option())

	var ids []int64
	commit := func(from, to int) {
		for i := from; i < to; i++ {
			row := h.stage(h.item(fmt.Sprintf("org_c%d", i%tenants), fmt.Sprintf("event:load%d", i), 1))
			ids = append(ids, row.ID)
			h.publish(row.ID)
		}
	}
	accepted := func() int {
		var n int
		if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_items WHERE state = 'accepted'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	commit(0, 300)
	h.await("delivery under way", func() bool { return accepted() >= 30 })
	if accepted() == 300 {
		t.Fatal("everything delivered before the consumers were deleted: no load to test")
	}
	for p := range outbox.PartitionsDefault {
		h.deleteConsumer(r.d.ConsumerName(p))
	}
	h.await("a stopped loop noticed", func() bool { return len(gate.partitions()) > 0 })
	if r.d.Ready() == nil || readyz(r) != http.StatusServiceUnavailable {
		t.Fatalf("ready while consume loops are down (readyz %d)", readyz(r))
	}
	if v := gauge(t, r.reg, "aurora_deliverer_consume_loop_running"); v != 0 {
		t.Fatalf("consume_loop_running %v while down", v)
	}
	commit(300, 400) // committed during the outage
	h.await("every loop noticed", func() bool { return len(gate.partitions()) >= outbox.PartitionsDefault })
	close(gate.release)
	h.await("ready again", func() bool { return r.d.Ready() == nil })
	if readyz(r) != http.StatusOK {
		t.Fatal("readyz not 200 after re-attach")
	}
	for _, id := range ids {
		h.awaitState(id, outbox.StateAccepted)
	}
	if n := h.emu.AppliedCount(); n != len(ids) {
		t.Fatalf("applied %d, committed %d", n, len(ids))
	}
	if d := h.emu.DuplicateApplications(); len(d) != 0 || h.emu.Overlaps() != 0 {
		t.Fatalf("duplicate applications %v, overlaps %d", d, h.emu.Overlaps())
	}
}

// Two deliverers configured with clashing filters on one durable: the
// second refuses to start, naming the consumer and both filters; the first
// keeps consuming with its own filter.
func TestClashingFiltersRefuseToStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	first := h.start(testConfig())

	other := testConfig()
	other.FilterSubject = outbox.SubjectPrefix + "." + outbox.TenantToken(outbox.DefaultExporter) + "." + outbox.TenantToken("org_2")
	second := h.start(other)
	select {
	case <-second.done:
	case <-time.After(20 * time.Second):
		t.Fatal("second deliverer started on a clashing consumer")
	}
	var clash *deliverer.ConsumerClashError
	if !errors.Is(second.err, deliverer.ErrConsumerClash) || !errors.As(second.err, &clash) {
		t.Fatalf("Run: %v, want a *ConsumerClashError", second.err)
	}
	ours, _ := deliverer.FilterFor(other.FilterSubject, 0)
	theirs, _ := deliverer.FilterFor(deliverer.DefaultFilterSubject(), 0)
	msg := second.err.Error()
	for _, want := range []string{first.d.ConsumerName(0), ours, theirs} {
		if !strings.Contains(msg, want) {
			t.Fatalf("error %q does not name %q", msg, want)
		}
	}
	if first.d.Ready() != nil {
		t.Fatalf("first deliverer not ready: %v", first.d.Ready())
	}
	row := h.stage(h.item("org_1", "event:clash", 1))
	h.publish(row.ID)
	h.awaitState(row.ID, outbox.StateAccepted)
	cons, err := h.js.Consumer(context.Background(), outbox.StreamName, first.d.ConsumerName(0))
	if err != nil {
		t.Fatal(err)
	}
	if f := cons.CachedInfo().Config.FilterSubject; f != theirs {
		t.Fatalf("consumer filter %q, want the first deliverer's %q", f, theirs)
	}
}

// flakyLookups is JetStream whose first consumerFails consumer lookups
// time out (as they do while a stream leader is being elected after a node
// died) and whose first streamFails stream lookups are answered 503, 10008
// (a cluster without a stream leader: NATS nodes down).
type flakyLookups struct {
	jetstream.JetStream
	mu                         sync.Mutex
	consumerFails, streamFails int
}

// fail spends one of n's failures; it reports whether this lookup fails.
func (s *flakyLookups) fail(n *int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *n == 0 {
		return false
	}
	*n--
	return true
}

func (s *flakyLookups) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	if s.fail(&s.consumerFails) {
		return nil, fmt.Errorf("consumer lookup: %w", context.DeadlineExceeded)
	}
	return s.JetStream.Consumer(ctx, stream, name)
}

func (s *flakyLookups) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if s.fail(&s.streamFails) {
		return nil, &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	}
	return s.JetStream.Stream(ctx, name)
}

// A deliverer started while JetStream cannot answer yet waits it out and
// then delivers, instead of exiting: the chaos harness's 3-node runs saw
// deliverers exit 30 times on "consumer …: context deadline exceeded"
// during leader elections, and the long run 5 times on "stream
// AURORA_OUTBOX: … 503 … JetStream system temporarily unavailable".
func TestStartWaitsOutJetStreamNotAnswering(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name                       string
		consumerFails, streamFails int
	}{
		{"consumer lookups time out", 3, 0},
		{"the stream has no leader (503)", 0, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, stripeemulator.Faults{})
			flaky := &flakyLookups{JetStream: h.js, consumerFails: c.consumerFails, streamFails: c.streamFails}
			h.js = flaky
			r := h.start(testConfig())
			row := h.stage(h.item("org_1", "event:election", 1))
			h.publish(row.ID)
			h.awaitState(row.ID, outbox.StateAccepted)
			select {
			case <-r.done:
				t.Fatalf("Run ended: %v", r.err)
			default:
			}
			flaky.mu.Lock()
			defer flaky.mu.Unlock()
			if flaky.consumerFails != 0 || flaky.streamFails != 0 {
				t.Fatalf("%d consumer and %d stream lookups never tried", flaky.consumerFails, flaky.streamFails)
			}
		})
	}
}

// labelled returns the counter name{label=value} in reg (0 when absent).
func labelled(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A partition consumer damaged on the server — registered, its store
// directory gone, which is what a `nats consumer rm` racing a create of the
// same durable leaves (the chaos harness's delete_consumer fault found it:
// every create and update is then refused with API error 10012, forever) —
// is deleted and created again by a deliverer starting onto it, which then
// delivers; nothing staged is lost.
func TestBrokenConsumerIsRecreated(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stripeemulator.Faults{})
	first := h.start(testConfig())
	h.await("first ready", func() bool { return first.d.Ready() == nil })
	row := h.stage(h.item("org_1", "event:before", 1))
	h.publish(row.ID)
	h.awaitState(row.ID, outbox.StateAccepted)
	first.stop(t)

	// damage every partition consumer the way the server race does
	dirs, err := filepath.Glob(filepath.Join(h.nats.Server().StoreDir(), "*", "streams", outbox.StreamName, "obs", "*"))
	if err != nil || len(dirs) != outbox.PartitionsDefault {
		t.Fatalf("consumer store directories %v (%v), want %d", dirs, err, outbox.PartitionsDefault)
	}
	for _, d := range dirs {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	var apiErr *jetstream.APIError
	_, err = h.js.CreateOrUpdateConsumer(context.Background(), outbox.StreamName, first.d.ConsumerConfig(0))
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeConsumerCreate {
		t.Fatalf("create on a damaged consumer: %v, want API error %d (the state this test needs)", err, jetstream.JSErrCodeConsumerCreate)
	}

	row2 := h.stage(h.item("org_1", "event:after", 1))
	h.publish(row2.ID)
	second := h.start(testConfig())
	h.await("second ready", func() bool { return second.d.Ready() == nil })
	h.awaitState(row2.ID, outbox.StateAccepted)
	if n := labelled(t, second.reg, "aurora_deliverer_errors_total", "op", "consumer_recreate"); n < outbox.PartitionsDefault {
		t.Fatalf("consumer_recreate %v, want ≥ %d (one per damaged consumer)", n, outbox.PartitionsDefault)
	}
	if n := h.emu.AppliedCount(); n != 2 {
		t.Fatalf("applied %d, want 2", n)
	}
}
