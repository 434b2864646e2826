package deliverer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Deliverer consumes the partitions of AURORA_OUTBOX and delivers items
// through an Exporter. It keeps no state of its own: any number of
// replicas of a pool share the pool's partition consumers, each partition
// pinned to one of them at a time (consume.go), and each lane of a
// partition runs one item at a time in its owner (lane.go). Safe for one
// Run at a time.
//
// The code is split by runtime role: consume.go (partition consumers,
// re-attach, ownership), lane.go (one goroutine per lane, its share of the
// window, deferral), attempt.go (claim, pre-send checks, the provider
// call), settle.go (outcome writes and message settlement), batch.go (group
// commit of the statements), queries.go (the SQL).
type Deliverer struct {
	db  DB
	js  jetstream.JetStream
	exp Exporter
	s   settings
	log *slog.Logger
	reg prometheus.Registerer
	m   *metrics
	rnd func() float64

	clock clock.Clock

	mu       sync.Mutex
	stopping bool
	wg       sync.WaitGroup // lane runners and overflow deferrals

	claims  chan claimCall
	records chan recordCall
	defers  chan deferCall
	// claimsExecuting, recordsExecuting: runners of each kind running a
	// statement now; claimsGather, recordsGather: held by the runner of
	// each kind that is gathering its batch (batch.go, lingerer).
	claimsExecuting, recordsExecuting atomic.Int32
	claimsGather, recordsGather       sync.Mutex

	lanes *lanes
	sem   chan struct{} // lanes running at once (AURORA_DELIVERER_CONCURRENCY)

	// claimErrLog logs a failed claim at most every claimErrLogEvery
	// (during a Postgres outage every group fails, hundreds a second);
	// claimErrs counts the failures since the last line it wrote. The
	// counter aurora_deliverer_errors_total{op="claim"} counts them all.
	claimErrLog rate.Sometimes
	claimErrs   atomic.Int64

	dbID       string // this deliverer's outbox.DatabaseID, set by Run
	partitions atomic.Int32
	attached   atomic.Int32 // partition consumers with a running consume loop
	foreignAt  atomic.Int64 // unix nanos of the last message of another database
	parts      []*partition
	running    atomic.Bool

	// beforeReattach, when set (tests only), runs before a stopped
	// consume loop of partition p is re-attached; it may block until ctx
	// ends.
	beforeReattach func(ctx context.Context, p int)
}

// New returns a Deliverer over db (a *pgxpool.Pool), js and exp with the
// validated cfg. Errors: cfg.Validate's *config.RangeError (config.ErrInvalid),
// an Option's ErrInvalidOption, or a metrics registration error.
func New(db DB, js jetstream.JetStream, exp Exporter, cfg Config, opts ...Option) (*Deliverer, error) {
	if db == nil || js == nil || exp == nil {
		return nil, fmt.Errorf("%w: db, js and exporter are required", ErrInvalidOption)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Deliverer{db: db, js: js, exp: exp, s: cfg.settings(), log: slog.Default(), clock: clock.DB{}, rnd: rand.Float64,
		claims: make(chan claimCall), records: make(chan recordCall), defers: make(chan deferCall),
		claimErrLog: rate.Sometimes{Interval: claimErrLogEvery}}
	for _, o := range opts {
		if err := o(d); err != nil {
			return nil, err
		}
	}
	if d.reg == nil {
		d.reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(d.reg, d.consuming)
	if err != nil {
		return nil, fmt.Errorf("deliverer: metrics: %w", err)
	}
	d.m = m
	d.lanes = newLanes(d.s.laneShare)
	d.sem = make(chan struct{}, d.s.concurrency)
	return d, nil
}

// Checks are the deliverer's readiness checks for ops.Handler: "consume"
// fails while any partition consumer has no running consume loop (before
// the first attach, after its consumer was deleted until it is recreated,
// after Run returned) and for a minute after a message of another outbox
// database arrived.
func (d *Deliverer) Checks() []ops.Check {
	return []ops.Check{{Name: "consume", Fn: func(context.Context) error { return d.Ready() }}}
}

// consuming reports whether Run is consuming and every partition consumer
// has a running consume loop: aurora_deliverer_consume_loop_running is 1
// exactly then.
func (d *Deliverer) consuming() bool {
	n, a := d.partitions.Load(), d.attached.Load()
	return d.running.Load() && n > 0 && a >= n
}

// Ready reports nil when every partition consumer has a running consume
// loop; otherwise an error saying how many are attached.
func (d *Deliverer) Ready() error {
	n, a := d.partitions.Load(), d.attached.Load()
	if !d.running.Load() {
		return errors.New("deliverer: not consuming (not started or stopped)")
	}
	if !d.consuming() {
		return fmt.Errorf("deliverer: %d of %d partition consumers attached", a, n)
	}
	if at := d.foreignAt.Load(); at != 0 && time.Since(time.Unix(0, at)) < time.Minute {
		return fmt.Errorf("deliverer: messages of another outbox database arrived (%w); left untouched", ErrForeignDatabase)
	}
	return nil
}

// Run consumes until ctx ends, then shuts down gracefully: it stops pulling,
// lets in-flight lanes finish their group and record its outcomes for up to
// the shutdown timeout, hands queued messages back to JetStream, then
// cancels what remains (a cancelled call is recorded as a retry with the
// same key). While the stream does not exist yet Run waits for it (the
// relay creates it).
//
// Run refuses to start with a *ForeignDatabaseError when the stream was
// created for another outbox database, and with a *ConsumerClashError when a
// running deliverer consumes this pool's consumers with other filter
// subjects. It returns nil after a graceful stop.
func (d *Deliverer) Run(ctx context.Context) error {
	n, err := d.prepare(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	d.partitions.Store(int32(n))
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopBatches := make(chan struct{})
	var batches sync.WaitGroup
	for range batchRunners {
		batches.Add(3)
		go func() { defer batches.Done(); d.runClaims(stopBatches) }()
		go func() { defer batches.Done(); d.runRecords(stopBatches) }()
		go func() { defer batches.Done(); d.runDefers(stopBatches) }()
	}
	defer func() { close(stopBatches); batches.Wait() }()
	d.mu.Lock()
	d.stopping = false
	d.mu.Unlock()

	stopBeats := make(chan struct{})
	go d.lanes.heartbeat(d.s.heartbeat, stopBeats, d.m)
	defer close(stopBeats)

	d.parts = make([]*partition, n)
	var attach sync.WaitGroup
	for p := range n {
		d.parts[p] = &partition{n: p}
		attach.Add(1)
		go func() { defer attach.Done(); d.attach(ctx, work, d.parts[p]) }()
	}
	d.running.Store(true)
	d.log.Info("deliverer: consuming", "consumer", d.s.consumer, "partitions", n, "filter", d.s.filterSubjects,
		"concurrency", d.s.concurrency, "database", d.dbID)
	<-ctx.Done()
	d.running.Store(false)
	d.mu.Lock()
	d.stopping = true
	d.mu.Unlock()
	attach.Wait() // every consume loop stopped: nothing new arrives
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d.s.shutdown):
		d.log.Warn("deliverer: shutdown timeout; cancelling in-flight calls", "timeout", d.s.shutdown)
		cancelWork()
		<-done
	}
	for _, m := range d.lanes.drainAll() {
		d.m.skips.WithLabelValues("shutdown").Inc()
		_ = m.Nak()
	}
	d.log.Info("deliverer: stopped")
	return nil
}

// isStopping reports whether Run is shutting down (no new work is taken).
func (d *Deliverer) isStopping() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopping
}

// enter registers a new lane runner or deferral unless Run is stopping.
func (d *Deliverer) enter() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return false
	}
	d.wg.Add(1)
	return true
}

// busy returns the busy delay jittered by ±50 %.
func (d *Deliverer) busy() time.Duration {
	return d.s.busyDelay/2 + time.Duration(d.rnd()*float64(d.s.busyDelay))
}

// ConsumerName returns the durable name of partition p's consumer:
// AURORA_DELIVERER_CONSUMER, "-p", p in two digits (aurora-deliverer-p07).
func (d *Deliverer) ConsumerName(p int) string { return fmt.Sprintf("%s-p%02d", d.s.consumer, p) }

// claimErrLogEvery: at most one "claim failed" log line this often.
const claimErrLogEvery = 5 * time.Second

// PriorityGroup is the priority group every deliverer pulls with; the
// partition consumers pin it to one client at a time.
const PriorityGroup = "lanes"

// ConsumerConfig is the durable pull consumer of partition p: the pool's
// filter subjects with p appended (FilterFor), explicit acks, AckWait from
// the configuration, unlimited deliveries (Postgres decides what is due; a
// message is only "try now"), the pinned-client priority policy with the
// configured pinned TTL, an ack-pending window a few lanes' shares wide,
// and metadata saying its deliverers accept batch messages
// (outbox.MetaBatchMessages).
func (d *Deliverer) ConsumerConfig(p int) jetstream.ConsumerConfig {
	filters := make([]string, 0, len(d.s.filterSubjects))
	for _, f := range d.s.filterSubjects {
		pf, _ := FilterFor(f, p) // validated by Config.Validate
		filters = append(filters, pf)
	}
	cc := jetstream.ConsumerConfig{
		Durable:        d.ConsumerName(p),
		Description:    "aurora deliverer partition " + fmt.Sprint(p) + " of " + outbox.StreamName,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        d.s.ackWait,
		MaxDeliver:     -1,
		MaxAckPending:  d.window(),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{PriorityGroup},
		PinnedTTL:      d.s.pinnedTTL,
		// Deliverers of this build accept batch messages (batchmsg.go); a
		// relay batches only for subjects such a consumer filters.
		Metadata: map[string]string{outbox.MetaBatchMessages: "1"},
	}
	if len(filters) == 1 {
		cc.FilterSubject = filters[0]
	} else {
		cc.FilterSubjects = filters
	}
	return cc
}

// window is a partition consumer's MaxAckPending: room for four lanes'
// shares and a pull of AURORA_DELIVERER_CONCURRENCY, at least 1,000.
func (d *Deliverer) window() int { return max(1000, 4*d.s.laneShare+d.s.concurrency) }
