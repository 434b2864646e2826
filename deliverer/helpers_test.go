package deliverer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const (
	acct     = "acct_1Test"
	feature  = "api_calls"
	testKey  = "sk_test_deliverer"
	customer = "cus_T1"
)

// harness is one test's real parts: a fresh database, an embedded
// JetStream, a Stripe emulator behind httptest, and a manual clock.
type harness struct {
	t     *testing.T
	pool  *pgxpool.Pool
	nats  *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	emu   *stripeemulator.Emulator
	srv   *httptest.Server
	clk   *clock.Manual
	meter stripeemulator.Meter

	mu   sync.Mutex
	gate func(r *http.Request) // runs before the emulator sees a request; may block
}

func quietLogger() *slog.Logger {
	if os.Getenv("DELIVERER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newHarness(t *testing.T, faults stripeemulator.Faults) *harness {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := &harness{t: t, pool: pool, nats: natstest.New(t), clk: clock.NewManual(time.Now().UTC().Add(10 * time.Second).Truncate(time.Second))}
	h.connect()
	h.emu, err = stripeemulator.New(stripeemulator.Config{Faults: faults})
	if err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		g := h.gate
		h.mu.Unlock()
		if g != nil && r.Method == http.MethodPost && r.URL.Path == "/v1/billing/meter_events" {
			g(r)
		}
		h.emu.ServeHTTP(w, r)
	}))
	t.Cleanup(h.srv.Close)
	h.meter, err = h.emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: feature})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.emu.AddCustomer(customer); err != nil {
		t.Fatal(err)
	}
	h.exec(`INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ($1, 'test', true)`, acct)
	h.exec(`INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name) VALUES ($1, $2, $3, $4)`, acct, feature, h.meter.ID, feature)
	h.addTenant("org_1", customer)
	return h
}

func (h *harness) connect() {
	h.t.Helper()
	nc, err := nats.Connect(h.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := relay.EnsureStream(context.Background(), js, relay.DefaultStreamConfig()); err != nil {
		h.t.Fatal(err)
	}
	h.nc, h.js = nc, js
}

func (h *harness) setGate(g func(r *http.Request)) {
	h.mu.Lock()
	h.gate = g
	h.mu.Unlock()
}

func (h *harness) exec(sql string, args ...any) {
	h.t.Helper()
	if _, err := h.pool.Exec(context.Background(), sql, args...); err != nil {
		h.t.Fatalf("%s: %v", sql, err)
	}
}

// addTenant maps tenant to a Stripe customer known to the emulator.
func (h *harness) addTenant(tenant, cus string) {
	h.t.Helper()
	if err := h.emu.AddCustomer(cus); err != nil {
		h.t.Fatal(err)
	}
	h.exec(`INSERT INTO tenant_billing (tenant, destination_account, stripe_customer) VALUES ($1, $2, $3)`, tenant, acct, cus)
}

// item is a valid event item of tenant occurring at the manual clock's now.
func (h *harness) item(tenant, ref string, qty int64) outbox.Item {
	return outbox.Item{
		Identity: identity.Identity{
			Tenant: tenant, SubjectKind: identity.SubjectEvent, SubjectRef: ref, Exporter: outbox.DefaultExporter,
			DestinationAccount: acct, Mode: identity.ModeTest, MappingVersion: 1,
		},
		Feature: feature, Quantity: qty, OccurredAt: h.clk.Now().Add(-time.Minute),
	}
}

// stage commits it and returns the row.
func (h *harness) stage(it outbox.Item, opts ...outbox.StageOption) outbox.Row {
	h.t.Helper()
	var row outbox.Row
	err := pgx.BeginFunc(context.Background(), h.pool, func(tx pgx.Tx) error {
		var err error
		row, err = outbox.Stage(context.Background(), tx, it, opts...)
		return err
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return row
}

// publish sends the message of the row's current dispatch, as the relay
// does: on its lane's partition, with the lane in the body.
func (h *harness) publish(id int64) {
	h.t.Helper()
	row := h.get(id)
	subject, msg := laneMessage(h.t, h.pool, row)
	if _, err := h.js.Publish(context.Background(), subject, msg.Encode(),
		jetstream.WithMsgID(outbox.MsgID(row.IdempotencyKey, row.Dispatch))); err != nil {
		h.t.Fatal(err)
	}
}

// laneMessage returns the subject and body the relay publishes row's
// current dispatch with (its lane read from tenant_billing and
// meter_mappings, the default partition count).
func laneMessage(t testing.TB, pool *pgxpool.Pool, row outbox.Row) (string, outbox.Message) {
	t.Helper()
	var cus, meter *string
	err := pool.QueryRow(context.Background(), `SELECT
		(SELECT stripe_customer FROM tenant_billing WHERE tenant = $1 AND destination_account = $2),
		(SELECT meter_id FROM meter_mappings WHERE destination_account = $2 AND feature = $3)`,
		row.Tenant, row.DestinationAccount, row.Feature).Scan(&cus, &meter)
	if err != nil {
		t.Fatal(err)
	}
	lane := outbox.UnmappedLane(row.DestinationAccount, row.Tenant, row.Feature)
	if cus != nil && meter != nil {
		lane = outbox.Lane(row.DestinationAccount, *cus, *meter)
	}
	msg := outbox.Message{ItemID: row.ID, Key: row.IdempotencyKey, Dispatch: row.Dispatch, Feature: row.Feature, Lane: lane}
	return outbox.PartitionSubject(row.Exporter, row.Tenant, outbox.Partition(lane, outbox.PartitionsDefault)), msg
}

// stagePublished stages n items of org_1 (refs prefix0…) and publishes each
// as the relay does, recording it published at at: without a new dispatch,
// only the re-dispatch sweep would publish such an item again.
func (h *harness) stagePublished(n int, prefix string, at time.Time) []outbox.Row {
	h.t.Helper()
	rows := make([]outbox.Row, 0, n)
	for i := range n {
		row := h.stage(h.item("org_1", fmt.Sprintf("%s%d", prefix, i), 1))
		rows = append(rows, row)
		h.publish(row.ID)
		h.exec(`UPDATE outbox_items SET published_dispatch = dispatch, published_at = $2::timestamptz WHERE id = $1`, row.ID, at)
	}
	return rows
}

// runRelay runs a relay on the harness's pool, JetStream and clock until
// the test ends.
func (h *harness) runRelay(rc relay.Config, opts ...relay.Option) {
	h.t.Helper()
	opts = append([]relay.Option{relay.WithClock(h.clk), relay.WithLogger(quietLogger())}, opts...)
	rl, err := relay.New(h.pool, h.js, rc, opts...)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	h.t.Cleanup(func() { cancel(); <-done })
}

// redispatch bumps the row's dispatch and publishes it (the relay's sweep of
// an expired lease, or of a retry that became due).
func (h *harness) redispatch(id int64) {
	h.t.Helper()
	h.exec(`UPDATE outbox_items SET dispatch = dispatch + 1 WHERE id = $1`, id)
	h.publish(id)
}

func (h *harness) get(id int64) outbox.Row {
	h.t.Helper()
	row, err := outbox.Get(context.Background(), h.pool, id)
	if err != nil {
		h.t.Fatal(err)
	}
	return row
}

// await polls cond until it holds or 20 s pass.
func (h *harness) await(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *harness) awaitState(id int64, want outbox.State) outbox.Row {
	h.t.Helper()
	var row outbox.Row
	h.await(fmt.Sprintf("item %d %s", id, want), func() bool {
		row = h.get(id)
		return row.State == want
	})
	return row
}

// attempt is one outbox_attempts row.
type attempt struct {
	Attempt    int
	LeaseToken int64
	Outcome    *string
	HTTPStatus *int
	RequestID  *string
	ErrorCode  *string
	Finished   bool
}

func (h *harness) attempts(id int64) []attempt {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), `SELECT attempt, lease_token, outcome, http_status, stripe_request_id, error_code, finished_at IS NOT NULL
		FROM outbox_attempts WHERE item_id = $1 ORDER BY lease_token`, id)
	if err != nil {
		h.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (attempt, error) {
		var a attempt
		err := r.Scan(&a.Attempt, &a.LeaseToken, &a.Outcome, &a.HTTPStatus, &a.RequestID, &a.ErrorCode, &a.Finished)
		return a, err
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

func outcomes(as []attempt) []string {
	var s []string
	for _, a := range as {
		if a.Outcome == nil {
			s = append(s, "<open>")
		} else {
			s = append(s, *a.Outcome)
		}
	}
	return s
}

// running is a Deliverer running in the background.
type running struct {
	d      *deliverer.Deliverer
	reg    *prometheus.Registry
	exp    *stripeexport.Exporter
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error
}

// stop shuts it down gracefully and waits.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		if r.err != nil {
			t.Fatalf("Run: %v", r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("deliverer did not stop")
	}
}

func (r *running) stale() float64 {
	return testutil.ToFloat64(mustCounter(r.reg, "aurora_deliverer_stale_leases_total"))
}

func mustCounter(reg *prometheus.Registry, name string) prometheus.Collector {
	return collectorFunc{reg: reg, name: name}
}

// collectorFunc re-exposes one metric family of reg (for testutil).
type collectorFunc struct {
	reg  *prometheus.Registry
	name string
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {}
func (c collectorFunc) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := c.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == c.name {
			for _, m := range mf.GetMetric() {
				ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(c.name, "", nil, nil), prometheus.CounterValue, m.GetCounter().GetValue())
			}
		}
	}
}

// testConfig: defaults with small concurrency and a short busy delay.
func testConfig() deliverer.Config {
	c := deliverer.DefaultConfig()
	c.Concurrency = 8
	c.BusyDelayMillis = 20
	c.ShutdownSeconds = 10
	return c
}

// start runs a deliverer with the harness's clock and a fresh exporter
// (a new process, as far as the provider can tell).
func (h *harness) start(cfg deliverer.Config, opts ...deliverer.Option) *running {
	h.t.Helper()
	exp, err := stripeexport.New(stripeexport.Config{APIKey: testKey, APIBase: h.srv.URL}, 10*time.Second, cfg.Concurrency)
	if err != nil {
		h.t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	base := []deliverer.Option{deliverer.WithClock(h.clk), deliverer.WithLogger(quietLogger()), deliverer.WithRegisterer(reg)}
	d, err := deliverer.New(h.pool, h.js, exp, cfg, append(base, opts...)...)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{d: d, reg: reg, exp: exp, cancel: cancel, done: make(chan struct{})}
	go func() { r.err = d.Run(ctx); close(r.done) }()
	h.t.Cleanup(func() {
		cancel()
		<-r.done
	})
	// Wait until every partition is attached, so deliverers (and the relay)
	// do not change the stream's consumers concurrently: nats-server
	// v2.15.2 has a data race between a stream update and a consumer
	// creation that the race detector reports.
	h.await("partition consumers attached", func() bool {
		select {
		case <-r.done:
			return true // Run refused to start: the test reads r.err
		default:
		}
		return d.Ready() == nil
	})
	return r
}

// publishDuplicateGeneration republishes the row's current dispatch under a
// fresh Nats-Msg-Id (a message JetStream does not deduplicate).
func (h *harness) publishDuplicateGeneration(id int64) {
	h.t.Helper()
	row := h.get(id)
	subject, msg := laneMessage(h.t, h.pool, row)
	if _, err := h.js.Publish(context.Background(), subject, msg.Encode(),
		jetstream.WithMsgID(fmt.Sprintf("dup-%d-%d", id, time.Now().UnixNano()))); err != nil {
		h.t.Fatal(err)
	}
}

// pending is the number of messages left in the stream (work queue: acked
// messages are removed).
func (h *harness) pending() uint64 {
	h.t.Helper()
	s, err := h.js.Stream(context.Background(), outbox.StreamName)
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return info.State.Msgs
}

// consumerTotals sums the redelivered and delivered counts of every
// partition consumer of r's pool.
func (h *harness) consumerTotals(r *running) (redelivered, delivered uint64) {
	h.t.Helper()
	for p := range outbox.PartitionsDefault {
		cons, err := h.js.Consumer(context.Background(), outbox.StreamName, r.d.ConsumerName(p))
		if err != nil {
			h.t.Fatal(err)
		}
		info, err := cons.Info(context.Background())
		if err != nil {
			h.t.Fatal(err)
		}
		redelivered += uint64(info.NumRedelivered)
		delivered += info.Delivered.Consumer

	}
	return redelivered, delivered
}
