package deliverer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrInvalidOption is wrapped by every Option that refuses its argument.
var ErrInvalidOption = errors.New("deliverer: invalid option")

// Option adjusts a Deliverer. Options validate themselves and return an
// error wrapping ErrInvalidOption.
type Option func(*Deliverer) error

// WithClock sets the clock whose Override is passed to SQL as "now"
// (default clock.DB{}: the database's now()). Tests pass a *clock.Manual.
func WithClock(c clock.Clock) Option {
	return func(d *Deliverer) error { d.clock = clock.Or(c); return nil }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(d *Deliverer) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		d.log = l
		return nil
	}
}

// WithRegisterer registers the deliverer's metrics on reg (default: a fresh
// private registry, i.e. metrics not exported).
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(d *Deliverer) error {
		if reg == nil {
			return fmt.Errorf("%w: nil registerer", ErrInvalidOption)
		}
		d.reg = reg
		return nil
	}
}

// WithAckWait overrides AckWait (and the InProgress heartbeat, a third of
// it) with a duration the environment cannot express, e.g. 600 ms in tests.
func WithAckWait(ackWait time.Duration) Option {
	return func(d *Deliverer) error {
		if ackWait < 100*time.Millisecond {
			return fmt.Errorf("%w: ack wait %s < 100ms", ErrInvalidOption, ackWait)
		}
		d.s.ackWait, d.s.heartbeat = ackWait, ackWait/3
		return nil
	}
}

// WithLease overrides the lease (default AURORA_OUTBOX_LEASE_SECONDS). With a
// clock.Manual the lease is measured on the manual clock.
func WithLease(lease time.Duration) Option {
	return func(d *Deliverer) error {
		if lease <= 0 {
			return fmt.Errorf("%w: lease %s", ErrInvalidOption, lease)
		}
		d.s.lease = lease
		return nil
	}
}

// WithBusyDelay overrides the NakWithDelay used when a row is locked or a
// delivery slot is busy.
func WithBusyDelay(delay time.Duration) Option {
	return func(d *Deliverer) error {
		if delay <= 0 {
			return fmt.Errorf("%w: busy delay %s", ErrInvalidOption, delay)
		}
		d.s.busyDelay = delay
		return nil
	}
}

// WithProviderTimeout overrides the deadline of one provider call.
func WithProviderTimeout(timeout time.Duration) Option {
	return func(d *Deliverer) error {
		if timeout <= 0 {
			return fmt.Errorf("%w: provider timeout %s", ErrInvalidOption, timeout)
		}
		d.s.providerTimeout = timeout
		return nil
	}
}

// WithJitter sets the source of backoff jitter: a function returning a
// uniform float64 in [0, 1) (default math/rand/v2). Tests pass a constant.
func WithJitter(rnd func() float64) Option {
	return func(d *Deliverer) error {
		if rnd == nil {
			return fmt.Errorf("%w: nil jitter source", ErrInvalidOption)
		}
		d.rnd = rnd
		return nil
	}
}

// Deliverer consumes AURORA_OUTBOX and delivers items through an Exporter.
// It keeps no state of its own: any number of replicas share a durable
// consumer. Safe for one Run at a time.
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
	wg       sync.WaitGroup

	claims  chan claimCall
	records chan recordCall
	groups  atomic.Int64 // group ids for claims (claimParams.Group)
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
		claims: make(chan claimCall), records: make(chan recordCall)}
	for _, o := range opts {
		if err := o(d); err != nil {
			return nil, err
		}
	}
	if d.reg == nil {
		d.reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(d.reg)
	if err != nil {
		return nil, fmt.Errorf("deliverer: metrics: %w", err)
	}
	d.m = m
	return d, nil
}

// ConsumerConfig is the durable pull consumer the deliverer creates or
// updates on AURORA_OUTBOX: explicit acks, AckWait from the configuration,
// unlimited deliveries (Postgres decides what is due; a message is only "try
// now"), MaxAckPending large enough for delayed messages.
func (d *Deliverer) ConsumerConfig() jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{
		Durable:       d.s.consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       d.s.ackWait,
		MaxDeliver:    -1,
		MaxAckPending: max(1000, 64*d.s.concurrency),
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if len(d.s.filterSubjects) == 1 {
		cc.FilterSubject = d.s.filterSubjects[0]
	} else {
		cc.FilterSubjects = d.s.filterSubjects
	}
	return cc
}

// Run consumes until ctx ends, then shuts down gracefully: it stops pulling,
// lets in-flight calls finish and record their outcomes for up to the
// shutdown timeout, then cancels what remains (a cancelled call is recorded
// as a retry with the same key). While the stream does not exist yet Run
// waits for it (the relay creates it). Returns nil after a graceful stop, or
// the JetStream error that prevented consuming.
func (d *Deliverer) Run(ctx context.Context) error {
	cons, err := d.consumer(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopBatches := make(chan struct{})
	var batches sync.WaitGroup
	for range batchRunners {
		batches.Add(2)
		go func() { defer batches.Done(); d.runClaims(stopBatches) }()
		go func() { defer batches.Done(); d.runRecords(stopBatches) }()
	}
	defer func() { close(stopBatches); batches.Wait() }()
	sem := make(chan struct{}, d.s.concurrency)
	d.mu.Lock()
	d.stopping = false
	d.mu.Unlock()
	ln := newLanes()
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		key, item := laneKey(msg)
		mode := ln.join(key, item, msg, func(m jetstream.Msg) func() { return d.heartbeat([]jetstream.Msg{m}) })
		if mode == laneQueued {
			return // queued behind the same tenant and feature
		}
		nakLane := func() {
			d.m.skips.WithLabelValues("shutdown").Inc()
			_ = msg.Nak()
			if mode != laneOwner {
				return
			}
			for _, q := range ln.drain(key) {
				d.m.skips.WithLabelValues("shutdown").Inc()
				_ = q.Nak()
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			nakLane()
			return
		}
		if !d.enter() {
			<-sem
			nakLane()
			return
		}
		go func() {
			defer d.wg.Done()
			defer func() { <-sem }()
			if mode == laneBypass {
				d.handleGroup(work, []jetstream.Msg{msg}, func() {})
				return
			}
			progress := func() { ln.touch(key) }
			for g := []jetstream.Msg{msg}; g != nil; g = ln.nextGroup(key, d.s.batch) {
				if ctx.Err() != nil {
					// Stopping: what is still queued goes back to JetStream.
					for _, m := range g {
						d.m.skips.WithLabelValues("shutdown").Inc()
						_ = m.Nak()
					}
					continue
				}
				d.handleGroup(work, g, progress)
			}
		}()
	},
		jetstream.PullMaxMessages(d.s.concurrency),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			d.log.Warn("deliverer: consume", "err", err)
		}))
	if err != nil {
		return fmt.Errorf("deliverer: consume: %w", err)
	}
	d.log.Info("deliverer: consuming", "consumer", d.s.consumer, "filter", strings.Join(d.s.filterSubjects, ","), "concurrency", d.s.concurrency)
	<-ctx.Done()
	d.mu.Lock()
	d.stopping = true
	d.mu.Unlock()
	cc.Stop()
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d.s.shutdown):
		d.log.Warn("deliverer: shutdown timeout; cancelling in-flight calls", "timeout", d.s.shutdown)
		cancelWork()
		<-done
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

// requeueHanded makes items handed to this process (no JetStream message)
// that it will not claim due now, so the relay publishes their new dispatch
// at once (requeue). If that fails, the relay publishes them when they fall
// due, one lease after the take.
func (d *Deliverer) requeueHanded(ms []outbox.Message, why string) {
	if len(ms) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := requeue(ctx, d.db, d.clock.Override(), ms); err != nil {
		d.m.errors.WithLabelValues("requeue").Inc()
		d.m.skips.WithLabelValues("handoff_unclaimed").Add(float64(len(ms)))
		d.log.Error("deliverer: handed-off items not requeued; the relay publishes them one lease after the take", "items", len(ms), "why", why, "err", err)
		return
	}
	d.m.skips.WithLabelValues("handoff_requeued").Add(float64(len(ms)))
	d.log.Debug("deliverer: handed-off items requeued", "items", len(ms), "why", why)
}

func (d *Deliverer) enter() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return false
	}
	d.wg.Add(1)
	return true
}

// consumer creates or updates the durable consumer, waiting for the stream
// and for NATS (retrying with backoff up to 5 s) until ctx ends. It returns
// at once when JetStream refuses the consumer (*jetstream.APIError).
func (d *Deliverer) consumer(ctx context.Context) (jetstream.Consumer, error) {
	wait := 100 * time.Millisecond
	for {
		cons, err := d.js.CreateOrUpdateConsumer(ctx, outbox.StreamName, d.ConsumerConfig())
		if err == nil {
			return cons, nil
		}
		var apiErr *jetstream.APIError
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			d.log.Info("deliverer: waiting for stream", "stream", outbox.StreamName)
		case errors.As(err, &apiErr):
			// JetStream answered and refused the consumer (its configuration
			// or the account's limits): waiting will not change that.
			return nil, fmt.Errorf("deliverer: consumer %s: %w", d.s.consumer, err)
		case ctx.Err() != nil:
			return nil, ctx.Err()
		default:
			// No answer (NATS down or still connecting, JetStream not
			// ready): wait it out, as the relay does.
			d.log.Warn("deliverer: JetStream not reachable yet, retrying", "err", err, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// busy returns the busy delay jittered by ±50 %.
func (d *Deliverer) busy() time.Duration {
	return d.s.busyDelay/2 + time.Duration(d.rnd()*float64(d.s.busyDelay))
}

// slotWaitLimit bounds how long a group keeps re-claiming items whose
// delivery slot another process holds (pauses of 4, 16, 64 and 256 ms: a
// third of a second in all) before handing their messages back to
// JetStream. Replicas that share a hot customer then take turns, a group
// each, instead of bouncing its messages through the busy delay; a slot
// whose holder died stays held until its lease expires, and then the
// messages have gone back long ago.
const slotWaitLimit = 128 * time.Millisecond

// nextWait is the pause before claiming a group's leftovers again: 1, 2, 4,
// 8, 16 ms while a row lock may be involved (the relay's, released within
// milliseconds); 4, 16, 64, 256 ms… when only busy slots are (another
// replica's group, which takes a call per item), so fewer claims are spent
// waiting for it.
func nextWait(wait time.Duration, slotOnly bool) time.Duration {
	if slotOnly {
		return max(4*wait, 4*time.Millisecond)
	}
	return max(2*wait, time.Millisecond)
}

// groupMsg is one message of a group being handled. msg is nil for an item
// another process handed to this one's delivery slot (handOff): there is no
// JetStream message to settle, so an item this process does not claim is
// requeued (made due now: the relay publishes the new dispatch the take gave
// it at once).
type groupMsg struct {
	msg jetstream.Msg
	m   outbox.Message
}

func (g groupMsg) ack() {
	if g.msg != nil {
		_ = g.msg.Ack()
	}
}

func (g groupMsg) term() {
	if g.msg != nil {
		_ = g.msg.Term()
	}
}

// nakWithDelay hands the message back to JetStream for delay; it reports
// false for a handed-off item (nothing to hand back).
func (g groupMsg) nakWithDelay(delay time.Duration) bool {
	if g.msg == nil {
		return false
	}
	_ = g.msg.NakWithDelay(delay)
	return true
}

// loser is an item whose claim found its delivery slot held by another lease.
type loser struct {
	g  groupMsg
	cr claimResult
}

// handOffLimit bounds a delivery slot's waiting list: past it, a loser
// falls back to claiming again and handing its messages back to JetStream.
const handOffLimit = 1000

// handleGroup handles a lane's group of messages (or one message): decode;
// claim every item in one statement (the group shares its delivery slot);
// pre-send checks and provider calls one at a time, in order; the outcomes
// in one fenced statement; then each message is settled. Items whose slot
// another lease holds are handed to that holder (handOffLosers). A row the
// relay still holds (its PubAck mark commits within milliseconds), or a slot
// that refused the hand-off, is usually free again very soon: such items are
// claimed again after 1, 2, 4, 8 and 16 ms (4, 16, 64 ms for busy slots: see
// nextWait and slotWaitLimit), after the rest of the group has been recorded
// (which frees the group's slot), before their message goes back to
// JetStream for the busy delay. Items handed to this group's slot are
// claimed next (mergeHanded). progress is called after every provider call.
func (d *Deliverer) handleGroup(ctx context.Context, msgs []jetstream.Msg, progress func()) {
	stopBeat := d.heartbeat(msgs)
	defer stopBeat()
	todo := make([]groupMsg, 0, len(msgs))
	seen := make(map[int64]bool, len(msgs))
	for _, msg := range msgs {
		m, err := outbox.DecodeMessage(msg.Data())
		if err != nil {
			d.m.skips.WithLabelValues("bad_message").Inc()
			d.log.Error("deliverer: bad message terminated", "subject", msg.Subject(), "err", err)
			_ = msg.Term()
			continue
		}
		if seen[m.ItemID] { // lanes never group one item twice; be safe anyway
			d.m.skips.WithLabelValues(verdictLocked.String()).Inc()
			_ = msg.NakWithDelay(d.busy())
			continue
		}
		seen[m.ItemID] = true
		todo = append(todo, groupMsg{msg: msg, m: m})
	}
	group := d.groups.Add(1)
	for wait, slotOnly := time.Duration(0), false; len(todo) > 0; wait = nextWait(wait, slotOnly) {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		ps := make([]claimParams, len(todo))
		for i, g := range todo {
			ps[i] = claimParams{ItemID: g.m.ItemID, Dispatch: g.m.Dispatch, Key: g.m.Key, Group: group, Handed: g.msg == nil}
		}
		crs, err := d.claim(ctx, ps)
		if err != nil {
			d.m.errors.WithLabelValues("claim").Inc()
			d.log.Error("deliverer: claim failed; messages delayed", "items", len(todo), "err", err)
			var handed []outbox.Message
			for _, g := range todo {
				if !g.nakWithDelay(d.busy()) {
					handed = append(handed, g.m)
				}
			}
			d.requeueHanded(handed, "claim_failed")
			return
		}
		var won []groupMsg
		var wonCR []claimResult
		var again []groupMsg
		busy := map[slotKey][]loser{}
		var slots []slotKey // in first-seen order
		slotOnly = true
		for i, cr := range crs {
			g := todo[i]
			if cr.Verdict != verdictClaimed {
				d.log.Debug("deliverer: not claimed", "item", g.m.ItemID, "dispatch", g.m.Dispatch, "why", cr.Verdict.String())
			}
			switch cr.Verdict {
			case verdictClaimed:
				won, wonCR = append(won, g), append(wonCR, cr)
			case verdictSlotBusy:
				if cr.Slot != nil {
					if _, ok := busy[*cr.Slot]; !ok {
						slots = append(slots, *cr.Slot)
					}
					busy[*cr.Slot] = append(busy[*cr.Slot], loser{g, cr})
					continue
				}
				fallthrough
			case verdictLocked:
				limit := 16 * time.Millisecond
				if cr.Verdict == verdictSlotBusy {
					limit = slotWaitLimit
				}
				if wait < limit && ctx.Err() == nil {
					again = append(again, g)
					slotOnly = slotOnly && cr.Verdict == verdictSlotBusy
					continue
				}
				d.settle(g, cr)
			default:
				d.settle(g, cr)
			}
		}
		again = append(again, d.handOffLosers(ctx, slots, busy, wait)...)
		var handed []outbox.Message
		if len(won) > 0 {
			handed = d.attempt(ctx, won, wonCR, progress)
		}
		todo = again
		if len(handed) > 0 && d.isStopping() {
			// Stopping: no new group; the relay publishes them again.
			d.requeueHanded(handed, "shutdown")
			handed = nil
		}
		if len(handed) > 0 {
			// Items other processes gave to the slot this group just freed:
			// claimed next, as one group, after a millisecond.
			var newer []outbox.Message
			todo, newer = mergeHanded(todo, handed)
			d.requeueHanded(newer, "newer_copy")
			wait, slotOnly = 0, false
		}
	}
}

// handOffLosers gives the items whose delivery slot another lease holds
// (busy, by slot in first-seen order) to that holder, which claims them
// when its outcome write frees the slot (migration 00015), instead of
// claiming them again here while it works. It acks the handed messages and
// returns the items to claim again (the slot was freed meanwhile, or its
// list is full) while wait is below slotWaitLimit; past it, messages go back
// to JetStream and handed-off items are requeued.
func (d *Deliverer) handOffLosers(ctx context.Context, slots []slotKey, busy map[slotKey][]loser, wait time.Duration) (again []groupMsg) {
	for _, slot := range slots {
		ls := busy[slot]
		ms := make([]outbox.Message, len(ls))
		for i, l := range ls {
			ms[i] = l.g.m
		}
		ok, err := handOff(ctx, d.db, d.clock.Override(), slot, ms, handOffLimit)
		if err != nil {
			d.m.errors.WithLabelValues("hand_off").Inc()
			d.log.Warn("deliverer: hand-off failed", "items", len(ls), "err", err)
		}
		var requeue []outbox.Message
		for _, l := range ls {
			switch {
			case ok:
				d.m.skips.WithLabelValues("handed_off").Inc()
				l.g.ack()
			case wait < slotWaitLimit && ctx.Err() == nil:
				again = append(again, l.g)
			case l.g.msg == nil:
				requeue = append(requeue, l.g.m) // one statement for the lot
			default:
				d.settle(l.g, l.cr)
			}
		}
		d.requeueHanded(requeue, verdictSlotBusy.String())
	}
	return again
}

// mergeHanded adds the handed-off messages a freed slot returned to todo,
// as message-less items. An item can be listed twice (handed on, swept to a
// new dispatch, handed again): the highest dispatch is the live one. A copy
// already in todo is kept, unless the handed one is newer: that one is
// returned in newer, to be requeued (the queued copy will find its dispatch
// stale).
func mergeHanded(todo []groupMsg, handed []outbox.Message) (_ []groupMsg, newer []outbox.Message) {
	queued := make(map[int64]int32, len(todo))
	for _, g := range todo {
		queued[g.m.ItemID] = g.m.Dispatch
	}
	latest := make(map[int64]int, len(handed)) // item → index in todo
	for _, m := range handed {
		if dispatch, ok := queued[m.ItemID]; ok {
			if m.Dispatch > dispatch {
				newer = append(newer, m)
			}
			continue
		}
		if i, ok := latest[m.ItemID]; ok {
			if m.Dispatch > todo[i].m.Dispatch {
				todo[i].m = m
			}
			continue
		}
		latest[m.ItemID] = len(todo)
		todo = append(todo, groupMsg{m: m})
	}
	return todo, newer
}

// settle hands back or acknowledges the message of an item that was not
// claimed, according to why.
func (d *Deliverer) settle(g groupMsg, cr claimResult) {
	m := g.m
	// back hands the message back to JetStream for delay; a handed-off item
	// has none and is requeued.
	back := func(why string, delay time.Duration) {
		if !g.nakWithDelay(delay) {
			d.requeueHanded([]outbox.Message{m}, why)
			return
		}
		d.m.skips.WithLabelValues(why).Inc()
	}
	switch cr.Verdict {
	case verdictClaimed:
		// Unreachable: claimed items are attempted.
		d.m.errors.WithLabelValues("verdict").Inc()
		g.nakWithDelay(d.busy())
	case verdictNotFound, verdictMismatch:
		d.m.skips.WithLabelValues(cr.Verdict.String()).Inc()
		d.log.Error("deliverer: message names no matching item; terminated", "item", m.ItemID, "key_prefix", keyPrefix(m.Key), "why", cr.Verdict.String())
		g.term()
	case verdictTerminal, verdictStaleDispatch:
		d.m.skips.WithLabelValues(cr.Verdict.String()).Inc()
		g.ack()
	case verdictNotDue:
		back(cr.Verdict.String(), max(cr.NextAttemptAt.Sub(cr.Now), d.s.busyDelay))
	case verdictLeasedLive:
		// Someone holds a live lease. Come back when it would expire: if the
		// holder died, this message claims it then (self-healing even before
		// the relay re-dispatches); if it finished, the row is terminal or
		// of a new dispatch and this message is acked.
		wait := d.s.busyDelay
		if cr.LeaseExpiresAt != nil {
			wait += cr.LeaseExpiresAt.Sub(cr.Now)
		}
		back(cr.Verdict.String(), wait)
	case verdictLocked, verdictSlotBusy:
		back(cr.Verdict.String(), d.busy())
	default:
		// Unreachable (the switch is exhaustive); on the message path a
		// programming error must not kill the process: hand the message back.
		d.m.errors.WithLabelValues("verdict").Inc()
		d.log.Error("deliverer: unhandled verdict; message delayed", "item", m.ItemID, "verdict", cr.Verdict.String())
		g.nakWithDelay(d.busy())
	}
}

// heartbeat sends InProgress for every message of msgs still unsettled
// every third of AckWait until stopped, so JetStream does not redeliver a
// message while its group runs.
func (d *Deliverer) heartbeat(msgs []jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	go func() {
		t := time.NewTicker(d.s.heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, msg := range msgs {
					if err := msg.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
						d.m.errors.WithLabelValues("in_progress").Inc()
					}
				}
			}
		}
	}()
	return func() { once.Do(func() { close(done) }) }
}

// leaseBudget is the share of the lease a group may spend on provider calls
// after its claim: a call is started only if it can end (provider timeout)
// within it, so no item of a long group is sent after its lease could have
// expired and been taken over.
func (d *Deliverer) leaseBudget() time.Duration { return d.s.lease - d.s.lease/10 }

// attempt runs the pre-send checks and the call for each claimed item of a
// group in order, writes the outcomes in one fenced statement, then settles
// each message. The first item is always attempted; a later one whose call
// could outlast the lease budget is not sent and is recorded as a retry due
// at once (same key, next dispatch). It returns the messages other
// processes handed to the delivery slot the group's outcome write freed.
func (d *Deliverer) attempt(ctx context.Context, msgs []groupMsg, crs []claimResult, progress func()) []outbox.Message {
	start := time.Now()
	recs := make([]record, len(crs))
	for i, cr := range crs {
		if i > 0 && time.Since(start)+d.s.providerTimeout > d.leaseBudget() {
			recs[i] = record{Item: cr.Item, Outcome: OutcomeRetry,
				LastError: fmt.Sprintf("lease_budget: group ran %s of a %s lease; not sent", time.Since(start).Round(time.Millisecond), d.s.lease)}
			continue
		}
		recs[i] = d.decide(ctx, cr)
		progress()
	}
	errs, handedPer, err := d.record(recs)
	var handed []outbox.Message
	for _, h := range handedPer {
		handed = append(handed, h...)
	}
	for i, rec := range recs {
		c, msg := rec.Item, msgs[i]
		if err == nil {
			err := errs[i]
			switch {
			case err == nil:
				d.m.outcomes.WithLabelValues(string(rec.Outcome), string(rec.Reason)).Inc()
				d.log.Info("deliverer: outcome", "item", c.ItemID, "key_prefix", keyPrefix(c.Key), "attempt", c.Attempts,
					"lease_token", c.LeaseToken, "outcome", string(rec.Outcome), "reason", string(rec.Reason),
					"rule", rec.Result.Rule, "http_status", rec.Result.HTTPStatus)
				msg.ack()
			case isStale(err):
				d.m.staleLeases.Inc()
				d.m.outcomes.WithLabelValues(string(OutcomeStaleLease), "").Inc()
				d.log.Warn("deliverer: stale lease; outcome not written", "item", c.ItemID, "key_prefix", keyPrefix(c.Key),
					"lease_token", c.LeaseToken, "would_be", string(rec.Outcome))
				msg.ack() // the current holder's message carries the item now
			default:
				d.m.errors.WithLabelValues("record").Inc()
				msg.nakWithDelay(d.busy())
			}
			continue
		}
		// Postgres did not take the outcome: the row stays leased to us
		// until the lease expires, then is reclaimed and resent with the
		// same key (Stripe collapses it). Come back then.
		d.m.errors.WithLabelValues("record").Inc()
		d.log.Error("deliverer: record outcome failed; item will be reclaimed after its lease", "item", c.ItemID, "err", err)
		if !msg.nakWithDelay(max(c.LeaseExpiresAt.Sub(crs[i].Now), d.s.busyDelay) + d.s.busyDelay) {
			// A new dispatch: the relay publishes it once the lease expires.
			d.requeueHanded([]outbox.Message{msg.m}, "record_failed")
		}
	}
	return handed
}

// decide runs the horizon, attempts and pre-send checks for a claimed item
// and, when they pass, the provider call; it returns the record to write.
func (d *Deliverer) decide(ctx context.Context, cr claimResult) record {
	c := cr.Item
	rec := record{Item: c}
	switch {
	case cr.Now.Sub(c.FirstAttemptAt) > d.s.horizon:
		rec.Outcome = OutcomeUncertain
		rec.LastError = fmt.Sprintf("horizon_exceeded: first attempt %s, now %s, horizon %s; not sent",
			c.FirstAttemptAt.UTC().Format(time.RFC3339), cr.Now.UTC().Format(time.RFC3339), d.s.horizon)
	case int(c.Attempts) > d.s.maxAttempts:
		rec.Outcome = OutcomeUncertain
		rec.LastError = fmt.Sprintf("attempts_exhausted: attempt %d > max %d; not sent", c.Attempts, d.s.maxAttempts)
	default:
		if f := preSend(c.Item, c.Ctx, d.exp.Mode(), cr.Now); f != nil {
			rec.Outcome, rec.Reason, rec.LastError = OutcomeQuarantined, f.Reason, string(f.Reason)+": "+f.Detail
			break
		}
		rec.Result = d.call(ctx, c)
		rec.Outcome = rec.Result.Outcome
		rec.Reason = rec.Result.Reason
		if rec.Outcome != OutcomeAccepted {
			rec.LastError = fmt.Sprintf("%s: http %d %s", rec.Result.Rule, rec.Result.HTTPStatus, rec.Result.ErrorCode)
		}
		if rec.Outcome == OutcomeRetry {
			if int(c.Attempts) >= d.s.maxAttempts {
				rec.Outcome = OutcomeUncertain
				rec.LastError = fmt.Sprintf("attempts_exhausted after %d attempts; last %s", c.Attempts, rec.LastError)
			} else {
				rec.RetryDelay = Backoff(int(c.Attempts), d.s.backoffBase, d.s.backoffCap, d.rnd)
			}
		}
	}
	return rec
}

// call sends one request with the provider deadline and records metrics.
func (d *Deliverer) call(ctx context.Context, c claimed) Result {
	req := Request{
		ItemID: c.ItemID, Key: c.Key, EventName: *c.Ctx.EventName,
		CustomerKey: deref(c.Ctx.CustomerKey, "stripe_customer_id"), ValueKey: deref(c.Ctx.ValueKey, "value"),
		Customer: *c.Ctx.StripeCustomer, Value: c.Item.Quantity, Timestamp: c.Item.OccurredAt,
	}
	cctx, cancel := context.WithTimeout(ctx, d.s.providerTimeout)
	defer cancel()
	d.m.inFlight.Inc()
	start := time.Now()
	res := sanitize(d.exp.Export(cctx, req))
	d.m.latency.WithLabelValues(string(res.Outcome)).Observe(time.Since(start).Seconds())
	d.m.inFlight.Dec()
	return res
}

// sanitize turns a result no table row could produce (an exporter bug) into
// uncertain: nobody knows what happened, and nothing automatic moves it.
func sanitize(r Result) Result {
	switch r.Outcome {
	case OutcomeAccepted, OutcomeRetry, OutcomeUncertain, OutcomeRejected:
		return r
	case OutcomeQuarantined:
		if r.Reason.Valid() {
			return r
		}
	case OutcomeStaleLease:
	}
	r.Rule = "invalid_result(" + string(r.Outcome) + "/" + string(r.Reason) + ")"
	r.Outcome, r.Reason = OutcomeUncertain, ""
	return r
}

func deref(p *string, def string) string {
	if p == nil || *p == "" {
		return def
	}
	return *p
}

// keyPrefix is the part of an idempotency key safe and sufficient for logs.
func keyPrefix(key string) string {
	if len(key) > 12 {
		return key[:12]
	}
	return key
}
