package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/provision"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options configure one run. Zero fields take the kill trial's values
// (KillTrial); Short gives the CI mode's.
type Options struct {
	Seed uint64 // seeds the producer and the fault schedule
	// Items staged by the producer over StageFor.
	Items int
	// HotTenants customers receive HotShare of the items (a few lanes
	// with many items); ColdTenants share the rest.
	HotTenants  int
	ColdTenants int
	HotShare    float64
	// CorrectionShare of the items are corrections of an earlier event of
	// the same tenant (producer.events), half negative, half positive.
	CorrectionShare float64
	// StageFor: how long the producer stages; faults run while it does.
	StageFor time.Duration
	// FaultGap: the gap between two faults is drawn in [FaultGap[0], FaultGap[1]].
	FaultGap [2]time.Duration
	// Weights of the fault kinds (Kinds order); all zero = DefaultWeights.
	Weights map[FaultKind]float64
	// OverlapFaults fires each fault at its planned time in its own
	// goroutine, so a fault that waits for its target (an owner of a hot
	// partition, a cluster with every node up) does not delay the ones after
	// it and faults may overlap. False (the short mode): one after another,
	// each waiting for the one before.
	OverlapFaults bool
	// Deliverers: deliverer processes (3).
	Deliverers int
	// Relays: relay processes (2); they share the work through FOR UPDATE
	// SKIP LOCKED.
	Relays int
	// LeaseSeconds: the outbox lease (AURORA_OUTBOX_LEASE_SECONDS) the
	// deliverers run with; an item a killed owner held waits this long.
	LeaseSeconds int
	// PinnedTTLSeconds: AURORA_DELIVERER_PINNED_TTL_SECONDS, the take-over
	// time of a dead owner's partitions.
	PinnedTTLSeconds int
	// Partitions of AURORA_OUTBOX (AURORA_OUTBOX_PARTITIONS).
	Partitions int
	// RelayBatchMessageItems: the relays' AURORA_RELAY_BATCH_MESSAGE_ITEMS
	// (0 = the relay's default, one message per item).
	RelayBatchMessageItems int
	// NATSNodes: nats-server processes, clustered when more than one;
	// AURORA_OUTBOX and AURORA_EVENTS get that many replicas (1 or 3).
	NATSNodes int
	// EmulatorFaults: the emulator's fault spec (stripeemulator.ParseFaults),
	// default "latency=20ms".
	EmulatorFaults string
	// WebhookCustomers: customers whose Stripe webhooks the sender plays
	// to the inboxes (webhooks.go); 0 = 40, negative = none.
	WebhookCustomers int
	// EventsDispatchMaxAttempts: the relays' AURORA_EVENTS_DISPATCH_MAX_ATTEMPTS
	// (0 = the default, 10: about 3 minutes of failed publishes before a
	// domain event is dead-lettered dispatch_exhausted for an operator).
	EventsDispatchMaxAttempts int
	// OutboxMaxAttempts: the deliverers' AURORA_OUTBOX_MAX_ATTEMPTS (0 =
	// the default, 20). Every claim counts as an attempt, a take-over of a
	// killed or stopped holder's item too: nobody can know whether the
	// dead holder called Stripe, and a poison item that kills every
	// deliverer that claims it must end uncertain, not loop forever.
	OutboxMaxAttempts int
	// DrainTimeout: how long after the last fault everything staged must
	// reach a state nothing automatic leaves.
	DrainTimeout time.Duration
	// Dir: the work directory (logs, the Postgres cluster, the NATS store);
	// "" = a new temporary one, removed after a green run unless Keep.
	Dir  string
	Keep bool
	// Bin: the binaries; zero = Build them into Dir from Src.
	Bin Binaries
	// Src: the aurora source tree the binaries are built from ("" = the
	// checkout holding the current directory); the planted-bug test builds
	// a mutated copy.
	Src string
	// Command reproduces this run (printed with a failure).
	Command string
	// Progress receives a line every few seconds (nil = none).
	Progress io.Writer
}

// KillTrial returns the options of issue 15's kill trial: 10,000 items on
// 3 deliverers, the emulator at 20 ms, the owner of hot lanes killed
// repeatedly.
func KillTrial(seed uint64) Options {
	return Options{Seed: seed, Items: 10000, HotTenants: 4, ColdTenants: 40, HotShare: 0.6,
		StageFor: 120 * time.Second, FaultGap: [2]time.Duration{2 * time.Second, 5 * time.Second},
		Weights:    map[FaultKind]float64{FaultKillOwner: 0.6, FaultStopCont: 0.2, FaultKillRelay: 0.2},
		Deliverers: 3, Relays: 2, LeaseSeconds: 30, PinnedTTLSeconds: 10, Partitions: 16, NATSNodes: 1, EmulatorFaults: "latency=20ms",
		DrainTimeout: 3 * time.Minute}
}

// ShortEmulatorFaults: the emulator's faults in the short mode, besides
// its 20 ms: 429s and 500s before anything is applied, answers lost
// after the event was applied (dropped connection, cut body), and
// requests held until the deliverer's Stripe timeout gives up, each of
// which the deliverer must retry with the same identifier.
const ShortEmulatorFaults = "latency=20ms,http429=0.02,http500=0.02,drop-after-apply=0.01,cut-after-apply=0.01,timeout=0.003"

// Short returns the CI mode: a few thousand items and at least 50 faults
// in under five minutes.
func Short(seed uint64) Options {
	o := KillTrial(seed)
	o.Items = 3000
	o.CorrectionShare = 0.03
	o.StageFor = 150 * time.Second
	o.FaultGap = [2]time.Duration{1200 * time.Millisecond, 3 * time.Second}
	o.Weights = DefaultWeights()
	o.LeaseSeconds = 20
	o.EmulatorFaults = ShortEmulatorFaults
	o.DrainTimeout = 100 * time.Second
	return o
}

// Long returns the release mode: 100,000 items and over 1,000 faults on a
// three-node JetStream cluster (streams at 3 replicas, the stream leader
// and followers killed too) in about half an hour.
func Long(seed uint64) Options {
	o := Short(seed)
	o.Items = 100000
	o.StageFor = 28 * time.Minute
	o.FaultGap = [2]time.Duration{900 * time.Millisecond, 2 * time.Second}
	o.NATSNodes = 3
	// 1,158 planned faults fired one after another ran 30 min past the
	// staging (kill_owner waits up to the take-over time for an owner):
	// fired on time they all come while the producer stages
	o.OverlapFaults = true
	// its overlapping NATS faults keep JetStream without a leader for
	// minutes at a time: with the default 10 publish attempts (about 3
	// minutes) the third long run dead-lettered one domain event
	// (dispatch_exhausted); 30 attempts ride out about 25 minutes
	o.EventsDispatchMaxAttempts = 30
	// an owner of the hot lanes is killed or stopped every 9 s for 28
	// minutes: the fourth long run left 2 hot-lane items uncertain after
	// 21 claims, 17 of them take-overs of a dead holder; 50 claims is the
	// budget of this density, far above any deployment's kill rate
	o.OutboxMaxAttempts = 50
	// the hot lanes (60 % of the items on four lanes, each at most one
	// call at a time: about 50 items/s at 20 ms) build a backlog of tens
	// of thousands while their owners are killed every few seconds; it
	// drains at about 100–200 items/s once the faults stop; the last items
	// are those a lane deferred (due at its estimate, at most 10 min away)
	// whose owner died before recalling them: the second long run ended 15
	// minutes after the load with 8 of them still pending, due within a
	// minute
	o.DrainTimeout = 30 * time.Minute
	return o
}

func (o *Options) defaults() {
	d := KillTrial(o.Seed)
	if o.Items <= 0 {
		o.Items = d.Items
	}
	if o.HotTenants <= 0 {
		o.HotTenants = d.HotTenants
	}
	if o.ColdTenants <= 0 {
		o.ColdTenants = d.ColdTenants
	}
	if o.HotShare <= 0 || o.HotShare > 1 {
		o.HotShare = d.HotShare
	}
	if o.StageFor <= 0 {
		o.StageFor = d.StageFor
	}
	if o.FaultGap[0] <= 0 || o.FaultGap[1] < o.FaultGap[0] {
		o.FaultGap = d.FaultGap
	}
	if len(o.Weights) == 0 {
		o.Weights = DefaultWeights()
	}
	if o.Deliverers <= 0 {
		o.Deliverers = d.Deliverers
	}
	if o.Relays <= 0 {
		o.Relays = d.Relays
	}
	if o.LeaseSeconds <= 0 {
		o.LeaseSeconds = d.LeaseSeconds
	}
	if o.PinnedTTLSeconds <= 0 {
		o.PinnedTTLSeconds = d.PinnedTTLSeconds
	}
	if o.Partitions <= 0 {
		o.Partitions = d.Partitions
	}
	if o.NATSNodes <= 0 {
		o.NATSNodes = d.NATSNodes
	}
	if o.NATSNodes > 1 && o.Weights[FaultKillStreamLeader] == 0 && o.Weights[FaultKillStreamFollower] == 0 {
		w := map[FaultKind]float64{FaultKillStreamLeader: 0.15, FaultKillStreamFollower: 0.1}
		for k, v := range o.Weights {
			w[k] = v
		}
		o.Weights = w
	}
	if o.EmulatorFaults == "" {
		o.EmulatorFaults = d.EmulatorFaults
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = d.DrainTimeout
	}
	if o.WebhookCustomers == 0 {
		o.WebhookCustomers = 40
	}
}

// ErrInvariant: the checker found a broken guarantee (Report.Failures says
// which).
var ErrInvariant = errors.New("chaos: invariant broken")

// account is the destination account the harness provisions.
const account = "acct_aurora_local"

// feature is the one metered feature (one meter: a lane is a customer).
const feature = "api_calls"

// stripeKey is the emulator key the deliverers send with (test mode).
const stripeKey = "sk_test_aurora_chaos"

// env is the parent environment without AURORA_* (the harness decides
// every service's configuration) plus kv.
func env(kv ...string) []string {
	var out []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "AURORA_") {
			out = append(out, e)
		}
	}
	return append(out, kv...)
}

// run is the state of one harness run.
type run struct {
	o          Options
	dir        string
	pg         *postgresCluster
	nats       *natsCluster
	natsURL    string
	nc         *nats.Conn // the harness's own connection (stream leaders)
	js         jetstream.JetStream
	emu        *proc
	emuURL     string
	relays     []*proc
	relayHTTP  []string
	dels       []*proc
	delHTTP    []string
	pool       *pgxpool.Pool
	dbURL      string
	customers  map[string]string // tenant → Stripe customer id
	hot        []string          // hot tenants
	cold       []string
	lanes      map[string]string // tenant → lane token
	partitions map[string]int    // tenant → partition
	began      time.Time

	recoveries sync.WaitGroup // restarts and SIGCONTs scheduled, not yet run
	notReady   []string       // services not ready after the heal

	wh *inboxes   // the inbox processes and the webhook sender (webhooks.go)
	ev eventsPart // domain events: the ledger processes, the reconciler (events.go)

	mu       sync.Mutex
	faults   []Fault   // injected (executed) faults
	stagedAt time.Time // when the producer had staged everything
}

// Run executes one run and returns its report; err is ErrInvariant
// (with the report) when a guarantee broke, or a setup error.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	r := &run{o: o, customers: map[string]string{}, lanes: map[string]string{}, partitions: map[string]int{}}
	dir := o.Dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "aurora-chaos-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r.dir = dir
	rep, err := r.run(ctx)
	r.teardown()
	if rep != nil {
		rep.Dir = dir
	}
	if err == nil && o.Dir == "" && !o.Keep {
		os.RemoveAll(dir)
		if rep != nil {
			rep.Dir = ""
		}
	}
	return rep, err
}

func (r *run) logf(format string, args ...any) {
	if r.o.Progress != nil {
		fmt.Fprintf(r.o.Progress, "chaos %6.1fs  "+format+"\n", append([]any{time.Since(r.began).Seconds()}, args...)...)
	}
}

func (r *run) run(ctx context.Context) (*Report, error) {
	r.began = time.Now()
	o := r.o
	if o.Bin == (Binaries{}) {
		r.logf("building cmd/aurora and nats-server into %s", r.dir)
		b, err := Build(ctx, r.dir, o.Src)
		if err != nil {
			return nil, err
		}
		r.o.Bin = b
	}
	var err error
	r.logf("starting postgres (initdb) and nats-server")
	if r.pg, err = startPostgres(ctx, r.dir); err != nil {
		return nil, err
	}
	if err := r.pg.createDatabase(ctx, "aurora"); err != nil {
		return nil, err
	}
	r.dbURL = r.pg.url("aurora")
	if _, err := migrations.Up(ctx, r.dbURL); err != nil {
		return nil, err
	}
	r.logf("starting %d nats-server node(s)", o.NATSNodes)
	if r.nats, err = startNATS(ctx, r.o.Bin.NATSServer, r.dir, o.NATSNodes); err != nil {
		return nil, err
	}
	r.natsURL = r.nats.url()
	if r.nc, err = nats.Connect(r.natsURL, nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true)); err != nil {
		return nil, err
	}
	if r.js, err = jetstream.New(r.nc); err != nil {
		return nil, err
	}
	if err := r.startEmulator(ctx); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(r.dbURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 8
	if r.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, err
	}
	meterID, err := r.provision(ctx)
	if err != nil {
		return nil, err
	}
	for t, c := range r.customers {
		r.lanes[t] = outbox.Lane(account, c, meterID)
		r.partitions[t] = outbox.Partition(r.lanes[t], o.Partitions)
	}
	if err := r.startServices(ctx); err != nil {
		return nil, err
	}
	if err := r.startEvents(ctx); err != nil {
		return nil, err
	}

	// Load and faults.
	r.logf("staging %d items over %s (%d hot tenants get %.0f%%), faults every %s–%s", o.Items, o.StageFor, o.HotTenants, 100*o.HotShare, o.FaultGap[0], o.FaultGap[1])
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	prod := &producer{r: r}
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := prod.run(loadCtx); err != nil {
			errc <- err
		}
		r.mu.Lock()
		r.stagedAt = time.Now()
		r.mu.Unlock()
	}()
	sched := Schedule(o.Seed, o.StageFor, o.FaultGap, o.Weights)
	go func() {
		defer wg.Done()
		r.inject(loadCtx, sched)
	}()
	if o.WebhookCustomers > 0 {
		go r.sendWebhooks(loadCtx, o.WebhookCustomers)
	}
	liveDone := make(chan struct{})
	go r.live(loadCtx, prod, liveDone)
	wg.Wait()
	stopLoad()
	<-liveDone
	select {
	case err := <-errc:
		return nil, err
	default:
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	loadEnded := time.Now()
	r.logf("load over: %d staged, %d faults injected; healing every process", prod.staged(), len(r.faultList()))
	if err := r.heal(ctx); err != nil {
		return nil, err
	}
	drained, err := r.waitDrained(ctx, prod.staged())
	if err != nil {
		return nil, err
	}
	drainSeconds := time.Since(loadEnded).Seconds()
	r.logf("drained=%t %.1fs after the load; checking", drained, drainSeconds)
	rep, err := r.check(ctx, prod)
	if err != nil {
		return nil, err
	}
	rep.Drained, rep.DrainSeconds = drained, drainSeconds
	if err := r.checkEvents(ctx, rep, prod.staged()); err != nil {
		return nil, err
	}
	rep.Exits = map[string]int{}
	for _, p := range append(r.services(), r.eventProcs()...) {
		if n := p.unexpectedExits(); n > 0 {
			rep.Exits[p.name] = n
		}
	}
	rep.Failures = append(append([]string{}, r.notReady...), rep.Failures...)
	if !drained {
		rep.Failures = append([]string{fmt.Sprintf("not drained %s after the load: items still pending or leased", o.DrainTimeout)}, rep.Failures...)
	}
	rep.ElapsedSeconds = time.Since(r.began).Seconds()
	if len(rep.Failures) > 0 {
		return rep, ErrInvariant
	}
	return rep, nil
}

func (r *run) startEmulator(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	r.emu = &proc{name: "stripe-emulator", bin: r.o.Bin.Aurora, dir: r.dir, env: env(),
		args: []string{"stripe-emulator", "--addr", addr, "--faults", r.o.EmulatorFaults, "--seed", strconv.FormatUint(r.o.Seed, 10)}}
	if err := r.emu.start(); err != nil {
		return err
	}
	r.emuURL = "http://" + addr
	return waitHTTP(ctx, r.emuURL+"/healthz", 30*time.Second)
}

// provision creates the account, the meter and one customer per tenant
// through the operator's code path, against the emulator process.
func (r *run) provision(ctx context.Context) (string, error) {
	api := provision.NewAPI(stripeKey, r.emuURL, nil)
	if err := provision.Account(ctx, r.pool, account, identity.ModeTest, true); err != nil {
		return "", err
	}
	m, err := provision.Meter(ctx, r.pool, api, account, feature, "aurora_"+feature)
	if err != nil {
		return "", err
	}
	for i := range r.o.HotTenants {
		r.hot = append(r.hot, fmt.Sprintf("hot-%02d", i))
	}
	for i := range r.o.ColdTenants {
		r.cold = append(r.cold, fmt.Sprintf("cold-%03d", i))
	}
	for _, t := range append(append([]string{}, r.hot...), r.cold...) {
		id, _, err := provision.Customer(ctx, r.pool, api, account, t)
		if err != nil {
			return "", err
		}
		r.customers[t] = id
	}
	return m.MeterID, nil
}

func (r *run) startServices(ctx context.Context) error {
	for i := range r.o.Relays {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		kv := []string{"AURORA_DATABASE_URL=" + r.dbURL, "AURORA_NATS_URL=" + r.natsURL, "AURORA_RELAY_HTTP_ADDR=" + addr,
			"AURORA_RELAY_POLL_MS=200", "AURORA_OUTBOX_PARTITIONS=" + strconv.Itoa(r.o.Partitions),
			"AURORA_OUTBOX_STREAM_REPLICAS=" + strconv.Itoa(r.o.NATSNodes), "AURORA_EVENTS_STREAM_REPLICAS=" + strconv.Itoa(r.o.NATSNodes)}
		if n := r.o.EventsDispatchMaxAttempts; n > 0 {
			kv = append(kv, "AURORA_EVENTS_DISPATCH_MAX_ATTEMPTS="+strconv.Itoa(n))
		}
		if n := r.o.RelayBatchMessageItems; n > 0 {
			kv = append(kv, "AURORA_RELAY_BATCH_MESSAGE_ITEMS="+strconv.Itoa(n))
		}
		p := &proc{name: fmt.Sprintf("relay-%d", i), supervise: true, bin: r.o.Bin.Aurora, dir: r.dir, args: []string{"relay"}, env: env(kv...)}
		if err := p.start(); err != nil {
			return err
		}
		r.relays = append(r.relays, p)
		r.relayHTTP = append(r.relayHTTP, addr)
		// the first relay creates the streams; the others find them
		if err := waitHTTP(ctx, "http://"+addr+"/readyz", 60*time.Second); err != nil {
			return err
		}
	}
	for i := range r.o.Deliverers {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p := &proc{name: fmt.Sprintf("deliverer-%d", i), supervise: true, bin: r.o.Bin.Aurora, dir: r.dir, args: []string{"deliverer"}, env: env(
			"AURORA_DATABASE_URL="+r.dbURL, "AURORA_NATS_URL="+r.natsURL, "AURORA_DELIVERER_HTTP_ADDR="+addr,
			"AURORA_STRIPE_API_KEY="+stripeKey, "AURORA_STRIPE_API_BASE="+r.emuURL,
			"AURORA_DELIVERER_DB_CONNS=8", "AURORA_OUTBOX_LEASE_SECONDS="+strconv.Itoa(r.o.LeaseSeconds),
			"AURORA_STRIPE_TIMEOUT_SECONDS="+strconv.Itoa(min(10, r.o.LeaseSeconds-1)),
			"AURORA_OUTBOX_BACKOFF_BASE_SECONDS=1", "AURORA_OUTBOX_BACKOFF_CAP_SECONDS=5",
			"AURORA_DELIVERER_PINNED_TTL_SECONDS="+strconv.Itoa(r.o.PinnedTTLSeconds), "AURORA_DELIVERER_SHUTDOWN_SECONDS=5")}
		if n := r.o.OutboxMaxAttempts; n > 0 {
			p.env = append(p.env, "AURORA_OUTBOX_MAX_ATTEMPTS="+strconv.Itoa(n))
		}
		if err := p.start(); err != nil {
			return err
		}
		r.dels = append(r.dels, p)
		r.delHTTP = append(r.delHTTP, addr)
	}
	for _, addr := range r.delHTTP {
		if err := waitHTTP(ctx, "http://"+addr+"/readyz", 60*time.Second); err != nil {
			return err
		}
	}
	if err := r.startInboxes(ctx); err != nil {
		return err
	}
	r.logf("%d relays, %d deliverers and %d inboxes ready", len(r.relays), len(r.dels), len(r.inboxProcs()))
	return nil
}

// services returns the supervised processes: the nats-server nodes, the
// relays, the deliverers and the inboxes.
func (r *run) services() []*proc {
	out := append([]*proc{}, r.nats.nodes...)
	out = append(out, r.relays...)
	out = append(out, r.dels...)
	return append(out, r.inboxProcs()...)
}

// resumeOrStart sends SIGCONT to each stopped process of ps and starts each
// one that is down (a supervised restart may win the race: fine).
func resumeOrStart(ps []*proc) error {
	for _, p := range ps {
		switch p.current() {
		case procStopped:
			_ = p.signal(sigCont)
		case procDown:
			if err := p.start(); err != nil && p.current() == procDown {
				return err
			}
		}
	}
	return nil
}

// heal resumes stopped processes and starts dead ones, then waits until
// every service is ready again; one that is not within a minute is a
// failure of the run (run.notReady), not of the harness.
func (r *run) heal(ctx context.Context) error {
	r.waitPending()
	if r.pg.proc.current() == procDown {
		if err := r.pg.proc.start(); err != nil && r.pg.proc.current() == procDown {
			return err
		}
	}
	if err := r.pg.waitReady(ctx, 60*time.Second); err != nil {
		return err
	}
	if err := resumeOrStart(r.services()); err != nil {
		return err
	}
	for i, addr := range append(append([]string{}, r.relayHTTP...), r.delHTTP...) {
		if err := waitHTTP(ctx, "http://"+addr+"/readyz", 60*time.Second); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			name := "deliverer-" + strconv.Itoa(i-len(r.relayHTTP))
			if i < len(r.relayHTTP) {
				name = "relay-" + strconv.Itoa(i)
			}
			r.notReady = append(r.notReady, fmt.Sprintf("%s not ready 60 s after the heal: %v", name, err))
		}
	}
	r.healInboxes(ctx)
	return r.healEvents(ctx)
}

// waitDrained waits until staged items exist and none is pending or
// leased, or the drain timeout passes (false).
func (r *run) waitDrained(ctx context.Context, staged int) (bool, error) {
	deadline := time.Now().Add(r.o.DrainTimeout)
	for {
		var n, open int
		err := r.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state IN ('pending', 'leased')) FROM outbox_items`).Scan(&n, &open)
		if err != nil {
			return false, err
		}
		if n >= staged && open == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		r.logf("draining: %d pending or leased", open)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// live prints a progress line every 5 s until ctx ends.
func (r *run) live(ctx context.Context, prod *producer, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var accepted, open int
		_ = r.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state IN ('accepted', 'confirmed')), count(*) FILTER (WHERE state IN ('pending', 'leased')) FROM outbox_items`).Scan(&accepted, &open)
		r.logf("staged %d, accepted %d, pending or leased %d, faults %d", prod.staged(), accepted, open, len(r.faultList()))
	}
}

func (r *run) teardown() {
	r.waitPending()
	if r.wh != nil {
		r.wh.stop()
	}
	r.stopEvents()
	for _, p := range append(append([]*proc{}, r.dels...), r.inboxProcs()...) {
		p.stop(10 * time.Second)
	}
	for _, p := range r.relays {
		p.stop(10 * time.Second)
	}
	if r.pool != nil {
		r.pool.Close()
	}
	if r.nc != nil {
		r.nc.Close()
	}
	if r.emu != nil {
		r.emu.stop(10 * time.Second)
	}
	if r.nats != nil {
		r.nats.stop()
	}
	if r.pg != nil {
		r.pg.proc.stop(20 * time.Second)
		if r.pg.tmp != "" {
			os.RemoveAll(r.pg.tmp)
		}
	}
}
