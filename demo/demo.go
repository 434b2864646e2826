// Package demo runs the whole export pipeline on real usage, in one process:
// a fresh migrated database, an embedded JetStream (unless AURORA_NATS_URL is
// set), the Stripe emulator (unless a Stripe key and base URL are set), the
// relay and several deliverers; it provisions meters and customers through
// the operator's code path (package provision), replays usage input through
// the cutover gate, waits until nothing is pending or leased, and summarises
// what was committed against what the provider applied.
package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/streamexport"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/demo/feed"
	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/provision"
	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/relay"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v76/client"
)

// Options configure one demo run.
type Options struct {
	DatabaseURL string // server to create the demo database on (AURORA_DATABASE_URL)
	NATSURL     string // "" = embedded JetStream (AURORA_NATS_URL)
	StripeKey   string // with StripeBase: send to that Stripe instead of the emulator
	StripeBase  string
	Account     string // destination account (AURORA_STRIPE_ACCOUNT)
	Input       string // access log or JSONL file; "" = the generator
	// RebaseTime shifts the input so its newest timestamp is the last
	// second of the hour before the run: relative order and spacing kept,
	// and every hourly summary window of the input already ended, so the
	// reconciliation at the end of the run can compare (and confirm) all
	// of it.
	RebaseTime bool
	// SkipReconcile: end without the reconciliation run (items stay
	// accepted, never confirmed).
	SkipReconcile bool
	Faults        string // emulator faults, e.g. "drop-after-apply=0.1,http500=0.1"
	// Exporter: the destination account's exporter, "v1" (default) or
	// "stream" (Stripe's v2 meter event stream).
	Exporter string
	// SessionTTL: the emulator's v2 session token lifetime (0 = 15 min);
	// short values make tokens expire mid-run.
	SessionTTL   time.Duration
	Deliverers   int // deliverer instances (default 2)
	Timeout      time.Duration
	KeepDatabase bool
	Seed         uint64 // generator and emulator seed
	GenTenants   int
	GenRequests  int
	Outbox       config.Outbox
	// RelayBatchMessageItems: the most items the relay puts in one
	// JetStream message (AURORA_RELAY_BATCH_MESSAGE_ITEMS; 0 or 1 = one
	// message per item).
	RelayBatchMessageItems int
	// Period is the usage period items are counted in (AURORA_USAGE_PERIOD;
	// "" = usage.PeriodDay).
	Period usage.Period
	// Deliverer configures every deliverer instance (validated; its Outbox
	// is replaced by Outbox). nil = deliverer.DefaultConfig().
	Deliverer *deliverer.Config
	// Stream configures the AURORA_OUTBOX stream the demo creates
	// (AURORA_OUTBOX_PARTITIONS, AURORA_OUTBOX_STREAM_REPLICAS,
	// AURORA_OUTBOX_DUPLICATE_WINDOW_SECONDS; validated). nil =
	// relay.DefaultStreamConfig().
	Stream   *relay.StreamConfig
	Progress io.Writer // progress lines (nil = none)
	Logger   *slog.Logger
}

// Summary is the --json contract (stable; add fields, never rename).
type Summary struct {
	Input                         string           `json:"input"`
	UsageEvents                   int              `json:"usage_events"`
	RejectedEvents                int              `json:"rejected_events"`
	FirstRejected                 []Rejected       `json:"first_rejected"`
	MalformedLines                int              `json:"malformed_lines"`
	FirstMalformed                []feed.Malformed `json:"first_malformed"`
	Tenants                       int              `json:"tenants"`
	ItemsStaged                   int              `json:"items_staged"`
	ItemsByState                  map[string]int   `json:"items_by_state"`
	QuarantinedByReason           map[string]int   `json:"quarantined_by_reason"`
	CommittedQuantity             map[string]int64 `json:"committed_quantity"`
	ProviderAppliedQuantity       map[string]int64 `json:"provider_applied_quantity"`
	ProviderDuplicateApplications int              `json:"provider_duplicate_applications"`
	Provider                      string           `json:"provider"`
	Faults                        string           `json:"faults"`
	ProviderRequests              map[string]int   `json:"provider_requests"`
	Exporter                      string           `json:"exporter"`                  // v1 or stream
	StreamEvents                  int              `json:"stream_events,omitempty"`   // events in stream requests the emulator processed (resends included)
	StreamSessions                int64            `json:"stream_sessions,omitempty"` // v2 sessions our clients created (first, refreshed, after an expired answer)
	Database                      string           `json:"database"`
	Drained                       bool             `json:"drained"`
	ElapsedSeconds                float64          `json:"elapsed_seconds"`
	ItemsPerSecond                float64          `json:"items_per_second"`
	// ReconciliationItems: open reconciliation items by kind after the
	// demo's reconciliation run, every kind present (0 when none); all 0
	// is a run whose provider holds exactly what was committed.
	ReconciliationItems map[string]int `json:"reconciliation_items"`
	// Reconciliation: what that run compared, confirmed and found; nil when
	// skipped (SkipReconcile, or the run did not drain).
	Reconciliation *reconciler.RunReport `json:"reconciliation,omitempty"`
	// ReconcileSeconds: how long that run took (not in ElapsedSeconds).
	ReconcileSeconds float64 `json:"reconcile_seconds"`
}

// Rejected is a well-formed input event the usage API refused (a correction
// of an unknown event, an event id reused with other content, …). It is
// counted and reported, never staged, and never aborts the run.
type Rejected struct {
	Line    int    `json:"line"` // 1-based input line the event came from (the generator: its request number)
	EventID string `json:"event_id"`
	Reason  string `json:"reason"`
}

// ErrNotDrained: items were still pending or leased when the timeout hit.
var ErrNotDrained = errors.New("demo: not drained before the timeout")

// ErrNoUsage: the input file held no usable usage line (empty, or every
// line malformed). The run still completes and its summary counts and
// reports the malformed lines; the error makes the exit status say that
// nothing was exercised.
var ErrNoUsage = errors.New("demo: the input has no usable usage lines")

// ErrQuantityOverflow: a committed or applied total does not fit the
// summary's int64. The sums are exact (numeric in Postgres, exact
// rationals in the emulator) and checked, never wrapped or rounded.
var ErrQuantityOverflow = errors.New("demo: quantity total out of int64 range")

// ErrInterrupted: ctx ended (Ctrl-C, SIGTERM) before the run finished. The
// components were stopped in order and the demo database dropped (unless
// KeepDatabase).
var ErrInterrupted = errors.New("demo: interrupted")

// Features the demo meters.
var features = []string{feed.FeatureAPICalls, feed.FeatureEgressBytes}

// Run executes the demo. It returns the summary even with ErrNotDrained,
// and ErrInterrupted (no summary) when ctx ends first.
func Run(ctx context.Context, o Options) (*Summary, error) {
	sum, err := run(ctx, o)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ErrNotDrained) {
		return nil, ErrInterrupted
	}
	return sum, err
}

func run(ctx context.Context, o Options) (*Summary, error) {
	if o.Deliverers <= 0 {
		o.Deliverers = 2
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log := o.Logger
	sum := &Summary{ItemsByState: map[string]int{}, QuarantinedByReason: map[string]int{}, CommittedQuantity: map[string]int64{},
		ProviderAppliedQuantity: map[string]int64{}, ProviderRequests: map[string]int{}, FirstMalformed: []feed.Malformed{}, FirstRejected: []Rejected{},
		ReconciliationItems: map[string]int{}}
	for _, s := range outbox.States {
		sum.ItemsByState[string(s)] = 0
	}

	// 1. Input first: a bad file fails before anything is started.
	res, err := readInput(o)
	if err != nil {
		return nil, err
	}
	sum.Input = "generator"
	if o.Input != "" {
		sum.Input = filepath.Base(o.Input)
	}
	if o.RebaseTime {
		res.Rebase(RebaseInstant(time.Now()))
	}
	sum.UsageEvents, sum.MalformedLines, sum.Tenants = len(res.Events), res.MalformedLines, res.Tenants
	sum.FirstMalformed = append(sum.FirstMalformed, res.FirstMalformed...)

	// 2. A fresh database.
	dbURL, dbName, drop, err := freshDatabase(ctx, o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	sum.Database = dbName
	if !o.KeepDatabase {
		defer drop()
	}
	if o.Progress != nil {
		// Named up front: a kill -9 skips the drop, and the summary that
		// names it is never printed.
		what := "dropped at the end; if the demo is killed, DROP DATABASE it"
		if o.KeepDatabase {
			what = "kept"
		}
		fmt.Fprintf(o.Progress, "aurora: demo: database %s (%s)\n", dbName, what)
	}
	if _, err := migrations.Up(ctx, dbURL); err != nil {
		return nil, err
	}
	poolCfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	poolCfg.MaxConns = int32(8 + 4*o.Deliverers)
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	// 3. JetStream.
	natsURL := o.NATSURL
	if natsURL == "" {
		dir, err := os.MkdirTemp("", "aurora-demo-nats-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if o.Progress != nil { // named for the same reason as the database
			fmt.Fprintf(o.Progress, "aurora: demo: JetStream store %s (removed at the end; if the demo is killed, rm -rf it)\n", dir)
		}
		srv, err := natstest.Start(dir, 0)
		if err != nil {
			return nil, err
		}
		defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
		natsURL = srv.ClientURL()
	}
	nc, err := nats.Connect(natsURL, nats.Name("aurora-demo"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("demo: connect to NATS at %s: %w", config.RedactURL(natsURL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, err
	}

	// 4. Stripe: the emulator unless a key and base URL are given.
	var emu *stripeemulator.Emulator
	key, base := o.StripeKey, o.StripeBase
	if key == "" || base == "" {
		faults, err := stripeemulator.ParseFaults(o.Faults)
		if err != nil {
			return nil, err
		}
		emu, err = stripeemulator.New(stripeemulator.Config{Faults: faults, Seed: o.Seed, SessionTTL: o.SessionTTL})
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		hs := &http.Server{Handler: emu, ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(ln) //nolint:errcheck // closed below
		defer hs.Close()
		key, base = "sk_test_aurora_demo", "http://"+ln.Addr().String()
		sum.Provider = "emulator"
		sum.Faults = faults.String()
	} else {
		sum.Provider = base
	}

	// 5. Provision through the operator's code path.
	api := provision.NewAPI(key, base, nil)
	mode := stripeexport.KeyMode(key)
	if err := provision.Account(ctx, pool, o.Account, mode, true); err != nil {
		return nil, err
	}
	sum.Exporter = cmp.Or(o.Exporter, deliverer.ExporterV1)
	if err := provision.SetExporter(ctx, pool, o.Account, sum.Exporter); err != nil {
		return nil, err
	}
	eventNames := map[string]string{}
	for _, f := range features {
		m, err := provision.Meter(ctx, pool, api, o.Account, f, "aurora_"+f)
		if err != nil {
			return nil, err
		}
		eventNames[m.EventName] = f
	}
	if err := provisionCustomers(ctx, pool, api, o.Account, res.Events); err != nil {
		return nil, err
	}
	log.Info("demo provisioned", "tenants", res.Tenants, "meters", len(features))

	// 6. Relay and deliverers.
	reg := prometheus.NewRegistry()
	rcfg := relay.DefaultConfig()
	if o.Stream != nil {
		rcfg.Stream = *o.Stream
	}
	rcfg.Outbox = o.Outbox
	rcfg.PollMS = 200
	// Batch messages only when asked (AURORA_RELAY_BATCH_MESSAGE_ITEMS):
	// the demo runs what a deployment should (docs/relay.md says why 1).
	rcfg.BatchMessageItems = max(o.RelayBatchMessageItems, 1)
	if _, err := relay.EnsureStream(ctx, js, rcfg.Stream); err != nil {
		return nil, err
	}
	// The relay's metrics on a registry of their own: the drain wait below
	// gathers reg every 50 ms, and the relay's backlog gauge is a query of
	// the outbox at each gather (cheap at a scrape every 15 s; at 20 a
	// second it cost the demo ~10 % of Postgres's time).
	rl, err := relay.New(pool, js, rcfg, relay.WithLogger(log), relay.WithRegistry(prometheus.NewRegistry()))
	if err != nil {
		return nil, err
	}
	dcfg := deliverer.DefaultConfig()
	if o.Deliverer != nil {
		dcfg = *o.Deliverer
	}
	dcfg.Outbox = o.Outbox
	v1, err := stripeexport.New(stripeexport.Config{APIKey: key, APIBase: base}, time.Duration(dcfg.ProviderTimeoutSeconds)*time.Second, dcfg.Concurrency)
	if err != nil {
		return nil, err
	}
	// One stream exporter (one session per account) per deliverer process,
	// as separate processes would have.
	streams := make([]*streamexport.Exporter, o.Deliverers)
	for i := range streams {
		if streams[i], err = streamexport.New(streamexport.Config{Client: streamexport.ClientConfig{APIKey: key, APIBase: base,
			Timeout: time.Duration(dcfg.ProviderTimeoutSeconds) * time.Second, MaxConns: dcfg.Concurrency,
			Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"instance": fmt.Sprint(i)}, reg)}, Linger: dcfg.StreamLinger()}); err != nil {
			return nil, err
		}
		defer streams[i].Close()
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var wg sync.WaitGroup
	errc := make(chan error, 1+o.Deliverers)
	start := func(name string, run func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				errc <- fmt.Errorf("demo: %s: %w", name, err)
			}
		}()
	}
	start("relay", rl.Run)
	for i := range o.Deliverers {
		exp := streamexport.Router{V1: v1, Stream: streams[i]}
		d, err := deliverer.New(pool, js, exp, dcfg, deliverer.WithLogger(log), deliverer.WithRegisterer(prometheus.WrapRegistererWith(prometheus.Labels{"instance": fmt.Sprint(i)}, reg)))
		if err != nil {
			return nil, err
		}
		start(fmt.Sprintf("deliverer %d", i), d.Run)
	}

	// 7. Replay usage and wait for the pipeline to drain.
	began := time.Now()
	gate := usage.Gate{
		Recorder: usage.Recorder{DestinationAccount: o.Account, Mode: mode, Period: cmp.Or(o.Period, usage.PeriodDay)},
		Sources:  usage.Sources{feed.FeatureAPICalls: usage.SourceEvents, feed.FeatureEgressBytes: usage.SourceEvents},
	}
	rejected, err := record(ctx, pool, gate, res.Events, res.EventLines)
	if err != nil {
		// Stop the relay and deliverers before the deferred pool.Close:
		// closing the pool under them made every in-flight write fail.
		stopRun()
		wg.Wait()
		return nil, err
	}
	sum.RejectedEvents = len(rejected)
	sum.FirstRejected = append(sum.FirstRejected, rejected[:min(len(rejected), feed.MaxReported)]...)
	drained, err := waitDrained(ctx, pool, reg, o.Timeout, o.Progress, errc)
	sum.ElapsedSeconds = time.Since(began).Seconds()
	stopRun()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	sum.Drained = drained
	for _, s := range streams {
		sum.StreamSessions += s.Client().Refreshes()
	}

	// The emulator's request counts are the delivery's: taken before the
	// reconciliation's own reads (summaries, invoices) add to them.
	var deliveryCounts map[stripeemulator.Outcome]int
	if emu != nil {
		deliveryCounts = emu.Counts()
	}

	// 8. Reconcile what was sent against the provider's own records.
	for _, k := range reconciler.Kinds {
		sum.ReconciliationItems[string(k)] = 0
	}
	if drained && !o.SkipReconcile {
		began := time.Now()
		rep, err := reconcile(ctx, pool, o, key, base, emu != nil, res)
		if err != nil {
			return nil, err
		}
		sum.Reconciliation, sum.ReconcileSeconds = &rep, time.Since(began).Seconds()
		open, err := reconciler.CountByKind(ctx, pool, reconciler.StateOpen)
		if err != nil {
			return nil, err
		}
		for k, n := range open {
			sum.ReconciliationItems[string(k)] = n
		}
	}

	// 9. What was committed, against what the provider applied.
	if err := summarise(ctx, pool, sum); err != nil {
		return nil, err
	}
	if sum.ElapsedSeconds > 0 {
		// Items that reached a state nothing automatic leaves, per second
		// (all of them when drained; fewer when the timeout hit).
		open := sum.ItemsByState[string(outbox.StatePending)] + sum.ItemsByState[string(outbox.StateLeased)]
		sum.ItemsPerSecond = float64(sum.ItemsStaged-open) / sum.ElapsedSeconds
	}
	if emu != nil {
		applied := map[string]*big.Rat{}
		for _, ev := range emu.Applied() {
			if ev.Cancelled {
				continue
			}
			f := eventNames[ev.EventName]
			if applied[f] == nil {
				applied[f] = new(big.Rat)
			}
			applied[f].Add(applied[f], ev.ExactValue())
		}
		for f, total := range applied {
			if !total.IsInt() || !total.Num().IsInt64() {
				return nil, fmt.Errorf("%w: %s applied at the provider is %s", ErrQuantityOverflow, f, total.RatString())
			}
			sum.ProviderAppliedQuantity[f] = total.Num().Int64()
		}
		sum.ProviderDuplicateApplications = len(emu.DuplicateApplications())
		sum.StreamEvents = emu.Stats().StreamEvents
		for k, v := range deliveryCounts {
			sum.ProviderRequests[string(k)] = v
		}
	}
	for _, f := range features {
		sum.CommittedQuantity[f] += 0
		if emu != nil {
			sum.ProviderAppliedQuantity[f] += 0
		}
	}
	if !drained {
		return sum, ErrNotDrained
	}
	if o.Input != "" && sum.UsageEvents == 0 {
		return sum, fmt.Errorf("%w (%d non-blank lines, %d malformed)", ErrNoUsage, res.Lines, sum.MalformedLines)
	}
	return sum, nil
}

func readInput(o Options) (*feed.Result, error) {
	if o.Input == "" {
		tenants, requests := o.GenTenants, o.GenRequests
		if tenants <= 0 {
			tenants = 50
		}
		if requests <= 0 {
			requests = 2000
		}
		return feed.Generate(o.Seed, tenants, requests, time.Now().UTC()), nil
	}
	f, err := os.Open(o.Input)
	if err != nil {
		return nil, fmt.Errorf("demo: --input: %w", err)
	}
	defer f.Close()
	head := make([]byte, 4096)
	n, _ := io.ReadFull(f, head)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return feed.Read(f, feed.DetectFile(o.Input, head[:n]), strings.TrimSuffix(filepath.Base(o.Input), filepath.Ext(o.Input)))
}

// freshDatabase creates aurora_demo_<time> on the server of serverURL and
// returns its URL and a function that drops it.
func freshDatabase(ctx context.Context, serverURL string) (string, string, func(), error) {
	cfg, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return "", "", nil, fmt.Errorf("demo: AURORA_DATABASE_URL: %w", err)
	}
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) { // the server answered: a role, database or password problem
			return "", "", nil, fmt.Errorf("demo: Postgres at AURORA_DATABASE_URL refused the connection: %w", err)
		}
		return "", "", nil, fmt.Errorf("demo: cannot reach Postgres at AURORA_DATABASE_URL (is it running?): %w", err)
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("aurora_demo_%d", time.Now().UnixNano())
	drop := func() {
		c, err := pgx.ConnectConfig(context.Background(), cfg)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
	// Not cancelled by Ctrl-C: a CREATE DATABASE the server finished while
	// the client gave up left the database behind (a fresh user's trial).
	// It takes a fraction of a second; the caller stops right after.
	if _, err := admin.Exec(context.WithoutCancel(ctx), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		drop()
		return "", "", nil, fmt.Errorf("demo: create database %s (the role needs CREATEDB): %w", name, err)
	}
	url, err := replaceDatabase(serverURL, name)
	if err != nil {
		drop()
		return "", "", nil, err
	}
	return url, name, drop, nil
}

// replaceDatabase returns serverURL (a postgres:// URL) naming database name.
func replaceDatabase(serverURL, name string) (string, error) {
	u, err := neturl.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("demo: AURORA_DATABASE_URL must be a postgres:// URL")
	}
	u.Path = "/" + name
	return u.String(), nil
}

// provisionCustomers creates a Stripe customer per tenant, 8 at a time.
func provisionCustomers(ctx context.Context, pool *pgxpool.Pool, api *client.API, account string, events []usage.Event) error {
	seen := map[string]bool{}
	var tenants []string
	for _, e := range events {
		if !seen[e.Tenant] {
			seen[e.Tenant] = true
			tenants = append(tenants, e.Tenant)
		}
	}
	sort.Strings(tenants)
	jobs := make(chan string)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range jobs {
				if _, _, err := provision.Customer(ctx, pool, api, account, t); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, t := range tenants {
		jobs <- t
	}
	close(jobs)
	wg.Wait()
	return first
}

// record replays events in transactions of up to 500 (Gate.RecordBatch)
// across 4 writers. A batch that fails on an event the usage API refuses
// (isDataError) is replayed one event per transaction, so only the refused
// events are left out; they are returned, not fatal.
//
// lines[i] is the input line of events[i] (reported with a refusal).
func record(ctx context.Context, pool *pgxpool.Pool, gate usage.Gate, events []usage.Event, lines []int) ([]Rejected, error) {
	const batch, writers = 500, 4
	type chunk struct {
		events []usage.Event
		lines  []int
	}
	jobs := make(chan chunk)
	errc := make(chan error, writers)
	var mu sync.Mutex
	var rejected []Rejected
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range jobs {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := gate.RecordBatch(ctx, tx, c.events)
					return err
				})
				if err != nil && isDataError(err) {
					err = nil
					for i, ev := range c.events {
						e := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
							_, _, err := gate.Record(ctx, tx, ev)
							return err
						})
						if e != nil && isDataError(e) {
							mu.Lock()
							rejected = append(rejected, Rejected{Line: c.lines[i], EventID: ev.EventID, Reason: e.Error()})
							mu.Unlock()
						} else if e != nil {
							err = e
							break
						}
					}
				}
				if err != nil {
					errc <- fmt.Errorf("demo: record: %w", err)
					return
				}
			}
		}()
	}
	var sendErr error
	for i := 0; i < len(events) && sendErr == nil; i += batch {
		select {
		case jobs <- chunk{events[i:min(i+batch, len(events))], lines[i:min(i+batch, len(lines))]}:
		case err := <-errc:
			sendErr = err
		}
	}
	close(jobs)
	wg.Wait()
	close(errc)
	if sendErr == nil {
		sendErr = <-errc
	}
	sort.Slice(rejected, func(i, j int) bool {
		return rejected[i].Line < rejected[j].Line || rejected[i].Line == rejected[j].Line && rejected[i].EventID < rejected[j].EventID
	})
	return rejected, sendErr
}

// isDataError reports whether err is the usage API refusing one event (as
// opposed to the database failing).
func isDataError(err error) bool {
	for _, target := range []error{usage.ErrInvalidEvent, usage.ErrEventConflict, usage.ErrCorrectedUnknown,
		usage.ErrCorrectionExceeds, usage.ErrAlreadyCancelled, usage.ErrNotCorrection, outbox.ErrPayloadConflict, outbox.ErrInvalidItem} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// waitDrained waits until no item is pending or leased, the timeout passes
// (false), ctx ends or a component fails. It watches the deliverers' outcome
// counters (cheap, every 50 ms) and asks Postgres only when they say every
// item may be terminal, and at least every 2 s: counting open rows costs a
// walk over index entries that every state change leaves behind (35 ms a
// poll at 19 k items, measured), on the cores the pipeline runs on. The
// database's answer alone decides.
func waitDrained(ctx context.Context, pool *pgxpool.Pool, reg prometheus.Gatherer, timeout time.Duration, progress io.Writer, errc <-chan error) (bool, error) {
	var staged, settledAtStage int
	// Items terminal without an attempt (quarantined when staged) never
	// reach a deliverer; every other item ends with one terminal outcome.
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE attempts = 0 AND state NOT IN ('pending', 'leased')) FROM outbox_items`).
		Scan(&staged, &settledAtStage); err != nil {
		return false, err
	}
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	lastAsked := time.Time{}
	for {
		resolved := settledAtStage + terminalOutcomes(reg)
		if progress != nil {
			fmt.Fprintf(progress, "\r%d items resolved, %d pending or leased   ", resolved, max(staged-resolved, 0))
		}
		if resolved >= staged || time.Since(lastAsked) >= 2*time.Second {
			lastAsked = time.Now()
			var open int
			// outbox_undecided holds every pending and leased item
			// (migration 00311); outbox_items has no index on state.
			err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_undecided u
			        JOIN outbox_items o ON o.id = u.item_id WHERE o.state IN ('pending', 'leased')`).Scan(&open)
			if err != nil {
				return false, err
			}
			if open == 0 {
				if progress != nil {
					fmt.Fprintf(progress, "\r%d items resolved, 0 pending or leased   \n", staged)
				}
				return true, nil
			}
		}
		if time.Now().After(deadline) {
			if progress != nil {
				fmt.Fprintln(progress)
			}
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case err := <-errc:
			return false, err
		case <-tick.C:
		}
	}
}

// RebaseInstant is where Options.RebaseTime puts the input's newest
// timestamp: the last second of the hour before now, so every hourly
// window the input touches has ended when the run begins.
func RebaseInstant(now time.Time) time.Time {
	return now.UTC().Truncate(time.Hour).Add(-time.Second)
}

// Demo reconciliation knobs. Against the demo's own emulator the summaries
// are complete as soon as an event is applied (no summary lag unless a
// test sets one), so the settle lag is 0 and the pace is not Stripe's: a
// real Stripe keeps the service's defaults (an hour's settle lag; 20
// requests a second), so a demo against it confirms only windows older
// than an hour.
const (
	demoReconcileRPS     = 2000
	demoReconcileTimeout = 10 * time.Second
)

// reconcile runs one provider reconciliation over the whole input: the
// lookback covers its oldest event (within the reconciler's 840 h).
func reconcile(ctx context.Context, pool *pgxpool.Pool, o Options, key, base string, emulated bool, res *feed.Result) (reconciler.RunReport, error) {
	settle, rps := reconciler.SettleLagDefault, reconciler.RequestsPerSecondDefault
	if emulated {
		settle, rps = 0, demoReconcileRPS
	}
	lookback := reconciler.LookbackDefault
	now := time.Now()
	for _, e := range res.Events {
		if span := now.Sub(e.OccurredAt) + 2*time.Hour; span > lookback {
			lookback = span
		}
	}
	lookback = min(lookback.Truncate(time.Hour), 840*time.Hour)
	provider, err := reconciler.NewStripeProvider(reconciler.StripeConfig{APIKey: key, APIBase: base}, rps, demoReconcileTimeout)
	if err != nil {
		return reconciler.RunReport{}, err
	}
	r := reconciler.New(pool, provider, reconciler.Options{
		Account: o.Account, SettleLag: settle, Lookback: lookback, RequestsPerSecond: rps, Log: o.Logger,
	})
	rep, err := r.Run(ctx)
	if err != nil {
		return rep, fmt.Errorf("demo: reconcile: %w", err)
	}
	return rep, nil
}

// terminalOutcomes sums the deliverers' terminal outcomes (accepted,
// rejected, uncertain, quarantined) from their metrics.
func terminalOutcomes(reg prometheus.Gatherer) int {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "aurora_deliverer_outcomes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "outcome" {
					continue
				}
				switch deliverer.Outcome(l.GetValue()) {
				case deliverer.OutcomeAccepted, deliverer.OutcomeRejected, deliverer.OutcomeUncertain, deliverer.OutcomeQuarantined:
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int(n)
}

func summarise(ctx context.Context, pool *pgxpool.Pool, sum *Summary) error {
	// sum(bigint) is numeric in Postgres: exact, without overflow. It is
	// read as text and added up exactly; a total beyond int64 is an error.
	rows, err := pool.Query(ctx, `SELECT state, coalesce(quarantine_reason, ''), feature, count(*), sum(quantity)::text FROM outbox_items GROUP BY 1, 2, 3`)
	if err != nil {
		return err
	}
	defer rows.Close()
	committed := map[string]*big.Int{}
	for rows.Next() {
		var state, reason, feature, qtyText string
		var n int
		if err := rows.Scan(&state, &reason, &feature, &n, &qtyText); err != nil {
			return err
		}
		sum.ItemsStaged += n
		sum.ItemsByState[state] += n
		if reason != "" {
			sum.QuarantinedByReason[reason] += n
		}
		if state == string(outbox.StateAccepted) || state == string(outbox.StateConfirmed) {
			qty, ok := new(big.Int).SetString(qtyText, 10)
			if !ok {
				return fmt.Errorf("demo: summary: sum of %s is %q, not an integer", feature, qtyText)
			}
			if committed[feature] == nil {
				committed[feature] = new(big.Int)
			}
			committed[feature].Add(committed[feature], qty)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for f, total := range committed {
		if !total.IsInt64() {
			return fmt.Errorf("%w: %s committed is %s", ErrQuantityOverflow, f, total)
		}
		sum.CommittedQuantity[f] = total.Int64()
	}
	return nil
}
