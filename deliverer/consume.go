package deliverer

import (
	"context"
	"errors"
	"fmt"
	"github.com/aurora-billing/aurora/shared/jsapi"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

// partition is the state of one partition consumer in this process.
type partition struct {
	n int

	mu    sync.Mutex
	pin   string // the last Nats-Pin-Id JetStream delivered to us on it
	owned bool
	// lostPin: the pin we know JetStream moved to another deliverer
	// (handover.go); "" when none.
	lostPin string
}

// setPin records the Nats-Pin-Id of a message JetStream delivered; a new
// one means we are pinned again (a buffered message under the pin we lost
// does not).
func (p *partition) setPin(pin string) {
	if pin == "" {
		return
	}
	p.mu.Lock()
	p.pin = pin
	if pin != p.lostPin {
		p.lostPin = ""
	}
	p.mu.Unlock()
}

// prepare resolves this deliverer's database identity and waits for the
// stream, then checks it: the partition count (written by the relay), the
// database the stream belongs to (*ForeignDatabaseError), and that no
// running deliverer consumes this pool's consumers with other filters
// (*ConsumerClashError). It returns the partition count.
func (d *Deliverer) prepare(ctx context.Context) (int, error) {
	wait := 100 * time.Millisecond
	pause := func() error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
		return nil
	}
	for d.dbID == "" {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		id, err := outbox.DatabaseID(qctx, d.db)
		cancel()
		if err == nil {
			d.dbID = id
			break
		}
		d.log.Warn("deliverer: database not reachable yet, retrying", "err", err, "retry_in", wait)
		if err := pause(); err != nil {
			return 0, err
		}
	}
	for {
		n, err := d.streamPartitions(ctx)
		if err == nil {
			err = d.checkClash(ctx, n)
			var clash *ConsumerClashError
			switch {
			case err == nil:
				return n, nil
			case errors.As(err, &clash), ctx.Err() != nil:
				return 0, err
			}
			// A consumer lookup that timed out or that JetStream could not
			// answer yet (a stream leader being elected after a node died)
			// is waited out like an unreachable JetStream: exiting here
			// turned every election into a restart of every deliverer
			// started during it.
			d.log.Warn("deliverer: partition consumers not readable yet, retrying", "err", err, "retry_in", wait)
			if err := pause(); err != nil {
				return 0, err
			}
			continue
		}
		switch {
		case errors.Is(err, ErrForeignDatabase):
			return 0, err
		case errors.Is(err, jetstream.ErrStreamNotFound):
			d.log.Info("deliverer: waiting for stream", "stream", outbox.StreamName)
		case errors.Is(err, ErrNoPartitions):
			d.log.Warn("deliverer: waiting for a relay that partitions the stream", "err", err)
		case jsapi.Refused(err):
			// JetStream refused the lookup; "temporarily unavailable" (no
			// stream leader, no quorum: jsapi.Unavailable) is not a refusal
			// and waits below like an unreachable JetStream.
			return 0, fmt.Errorf("deliverer: stream %s: %w", outbox.StreamName, err)
		case ctx.Err() != nil:
			return 0, ctx.Err()
		default:
			d.log.Warn("deliverer: JetStream not reachable yet, retrying", "err", err, "retry_in", wait)
		}
		if err := pause(); err != nil {
			return 0, err
		}
	}
}

// brokenConsumerAfter: consecutive "consumer create" refusals of one
// partition consumer after which attach deletes it to create it again.
const brokenConsumerAfter = 3

// consumerBroken reports whether err is JetStream refusing to create or
// update a consumer (API error 10012, JSErrCodeConsumerCreate). nats-server
// answers it, for every create and update, when a consumer's state on the
// server is damaged: a delete that raced a create of the same durable
// (`nats consumer rm` under load) can leave the consumer registered with
// its store directory gone ("open …/obs/<name>/meta.inf.tmp: no such file
// or directory"), and only deleting it clears that.
func consumerBroken(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeConsumerCreate
}

// dropBrokenConsumer deletes partition p's consumer after JetStream refused
// to create or update it brokenConsumerAfter times in a row (consumerBroken),
// so that the next attach creates it afresh. Nothing is lost: the stream
// keeps every unacknowledged message (work queue retention) and a new
// consumer delivers them again; Postgres decides what is still due. Counted
// as aurora_deliverer_errors_total{op="consumer_recreate"}.
func (d *Deliverer) dropBrokenConsumer(ctx context.Context, p int, cause error) {
	d.m.errors.WithLabelValues("consumer_recreate").Inc()
	d.log.Warn("deliverer: JetStream keeps refusing the partition consumer; deleting it to create it again",
		"consumer", d.ConsumerName(p), "refusals", brokenConsumerAfter, "err", cause)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := d.js.DeleteConsumer(cctx, outbox.StreamName, d.ConsumerName(p)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		d.log.Warn("deliverer: could not delete the broken consumer", "consumer", d.ConsumerName(p), "err", err)
	}
}

// streamPartitions reads the stream's metadata: the partition count
// (ErrNoPartitions when absent or not a number in 1..1024) and the outbox
// database (*ForeignDatabaseError when another's).
func (d *Deliverer) streamPartitions(ctx context.Context) (int, error) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := d.js.Stream(sctx, outbox.StreamName)
	if err != nil {
		return 0, err
	}
	meta := s.CachedInfo().Config.Metadata
	if db := meta[outbox.MetaDatabase]; db != "" && db != d.dbID {
		return 0, &ForeignDatabaseError{Where: "stream " + outbox.StreamName, Ours: d.dbID, Their: db}
	}
	n, err := strconv.Atoi(meta[outbox.MetaPartitions])
	if err != nil || n < 1 || n > 1024 {
		return 0, fmt.Errorf("%w: metadata %s=%q", ErrNoPartitions, outbox.MetaPartitions, meta[outbox.MetaPartitions])
	}
	return n, nil
}

// checkClash refuses to start when a partition consumer of this pool exists
// with other filter subjects and someone consumes it (a client is pinned or
// pull requests wait): two deliverers configured differently on one
// durable would otherwise take turns rewriting its filter. A consumer
// nobody consumes is updated to this configuration by attach.
func (d *Deliverer) checkClash(ctx context.Context, n int) error {
	for p := range n {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := d.js.Consumer(cctx, outbox.StreamName, d.ConsumerName(p))
		cancel()
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("deliverer: consumer %s: %w", d.ConsumerName(p), err)
		}
		info := c.CachedInfo()
		theirs, ours := filtersOf(info.Config), filtersOf(d.ConsumerConfig(p))
		if slices.Equal(theirs, ours) {
			continue
		}
		if info.NumWaiting > 0 || pinnedID(info) != "" {
			return &ConsumerClashError{Consumer: d.ConsumerName(p), Theirs: theirs, Ours: ours}
		}
	}
	return nil
}

func filtersOf(cc jetstream.ConsumerConfig) []string {
	fs := slices.Clone(cc.FilterSubjects)
	if cc.FilterSubject != "" {
		fs = append(fs, cc.FilterSubject)
	}
	slices.Sort(fs)
	return fs
}

func pinnedID(info *jetstream.ConsumerInfo) string {
	for _, g := range info.PriorityGroups {
		if g.Group == PriorityGroup {
			return g.PinnedClientID
		}
	}
	return ""
}

// attach keeps partition p consumed until ctx ends: it creates or updates
// the consumer, starts a consume loop, and watches it. The loop is
// restarted when it ends by itself (JetStream told the client its consumer
// was deleted: nats consumer rm, a stream recreated after its store was
// lost) and when an attach check finds the consumer gone, recreated by
// someone else or re-filtered; the consumer is then created again and a
// new loop started at once, or after a growing pause (100 ms doubling to
// 5 s) when the previous loop lived less than loopSteady. Readiness (Ready)
// and aurora_deliverer_consume_loop_running count the loops running. A
// stream recreated for another outbox database is not consumed: the loop
// stays down, logged, until it is fixed.
func (d *Deliverer) attach(ctx, work context.Context, p *partition) {
	wait := 100 * time.Millisecond
	pause := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
		return true
	}
	createFailures := 0
	for ctx.Err() == nil {
		l, err := d.startConsume(ctx, work, p)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.m.errors.WithLabelValues("attach").Inc()
			d.log.Warn("deliverer: partition not attached, retrying", "consumer", d.ConsumerName(p.n), "err", err, "retry_in", wait)
			if consumerBroken(err) {
				if createFailures++; createFailures >= brokenConsumerAfter {
					createFailures = 0
					d.dropBrokenConsumer(ctx, p.n, err)
				}
			} else {
				createFailures = 0
			}
			if !pause() {
				return
			}
			continue
		}
		createFailures = 0
		started := time.Now()
		d.attached.Add(1)
		d.m.attached.Inc()
		why := d.watch(ctx, l, p)
		l.cc.Stop()
		d.attached.Add(-1)
		d.m.attached.Dec()
		d.setOwned(p, false)
		if ctx.Err() != nil {
			return
		}
		d.m.errors.WithLabelValues("reattach").Inc()
		d.log.Warn("deliverer: consume loop stopped; re-attaching", "consumer", d.ConsumerName(p.n), "why", why)
		if time.Since(started) >= loopSteady {
			wait = 100 * time.Millisecond
		} else if !pause() { // a loop that keeps ending: do not hammer JetStream
			return
		}
		if d.beforeReattach != nil {
			d.beforeReattach(ctx, p.n)
		}
	}
}

// loopSteady is how long a consume loop must have run for its end to be
// re-attached at once rather than after attach's growing pause.
const loopSteady = 10 * time.Second

// loop is one running consume loop of a partition consumer.
type loop struct {
	cc   jetstream.ConsumeContext
	cons jetstream.Consumer

	mu      sync.Mutex
	lastErr error // the last error the consume loop reported
}

func (l *loop) setErr(err error) {
	l.mu.Lock()
	l.lastErr = err
	l.mu.Unlock()
}

func (l *loop) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastErr
}

// startConsume checks the stream's database, creates or updates partition
// p's consumer and starts its consume loop.
func (d *Deliverer) startConsume(ctx, work context.Context, p *partition) (*loop, error) {
	if _, err := d.streamPartitions(ctx); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	cons, err := d.js.CreateOrUpdateConsumer(cctx, outbox.StreamName, d.ConsumerConfig(p.n))
	cancel()
	if err != nil {
		return nil, err
	}
	l := &loop{cons: cons}
	l.cc, err = cons.Consume(func(msg jetstream.Msg) { d.onMessage(work, p, msg) },
		jetstream.PullPriorityGroup(PriorityGroup),
		jetstream.PullMaxMessages(min(d.s.concurrency, d.s.laneShare)),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrPinIDMismatch) {
				p.lose() // JetStream pinned another client (handover.go)
				d.setOwned(p, false)
			}
			l.setErr(err)
			d.log.Debug("deliverer: consume", "consumer", d.ConsumerName(p.n), "err", err)
		}))
	if err != nil {
		return nil, fmt.Errorf("deliverer: consume %s: %w", d.ConsumerName(p.n), err)
	}
	return l, nil
}

// watch returns why partition p's consume loop must be restarted, or ""
// when ctx ends: the loop ended by itself (the client stops it when
// JetStream answers that the consumer was deleted, or on a bad request or
// a closed connection), or an attach check (every d.s.attachCheck) found
// the consumer deleted, recreated or changed. It also tracks whether this
// process owns the partition (JetStream pinned it to us).
func (d *Deliverer) watch(ctx context.Context, l *loop, p *partition) string {
	want := d.ConsumerConfig(p.n)
	created := l.cons.CachedInfo().Created
	t := time.NewTicker(d.s.attachCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-l.cc.Closed():
			if err := l.err(); err != nil {
				return "consume loop ended: " + err.Error()
			}
			return "consume loop ended"
		case <-t.C:
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := l.cons.Info(ictx)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
			return "consumer deleted"
		case err != nil:
			continue // no answer (NATS reconnecting): the loop resumes by itself
		case !info.Created.Equal(created):
			return "consumer recreated"
		case !slices.Equal(filtersOf(info.Config), filtersOf(want)):
			return fmt.Sprintf("consumer re-filtered to %v", filtersOf(info.Config))
		case info.Config.PriorityPolicy != jetstream.PriorityPolicyPinned:
			return "consumer priority policy changed"
		}
		p.mu.Lock()
		pin := p.pin
		p.mu.Unlock()
		switch pid := pinnedID(info); {
		case pin != "" && pid == pin:
			p.keep()
		case pin != "" && pid != "":
			p.lose() // pinned to another deliverer (handover.go)
		}
		d.setOwned(p, pin != "" && pinnedID(info) == pin)
	}
}

// setOwned records whether this process owns partition p, logging changes.
func (d *Deliverer) setOwned(p *partition, owned bool) {
	p.mu.Lock()
	changed := p.owned != owned
	p.owned = owned
	p.mu.Unlock()
	if !changed {
		return
	}
	v := 0.0
	if owned {
		v = 1
	}
	d.m.owned.WithLabelValues(strconv.Itoa(p.n)).Set(v)
	d.log.Info("deliverer: partition ownership", "consumer", d.ConsumerName(p.n), "owned", owned)
}

// Owned returns the partitions this process owns (JetStream pinned them to
// it), as last seen by the attach checks.
func (d *Deliverer) Owned() []int {
	var out []int
	for _, p := range d.parts {
		p.mu.Lock()
		if p.owned {
			out = append(out, p.n)
		}
		p.mu.Unlock()
	}
	return out
}

// onMessage routes one message of partition p to its lane: a lane with no
// runner gets one (waiting for a free runner slot: the consume loop's
// backpressure), a running lane queues it while the lane holds less than
// its share, and a lane over its share defers it to the relay (deferral).
// A message of another outbox database is left untouched (delayed, never
// terminated); one that does not decode is terminated. A batch message is
// split into its items (splitBatch), each routed as a message of its own. A panic is recovered
// (the message is handed back) so a bug cannot end the process.
func (d *Deliverer) onMessage(work context.Context, p *partition, msg jetstream.Msg) {
	defer func() {
		if r := recover(); r != nil {
			d.m.errors.WithLabelValues("panic").Inc()
			d.log.Error("deliverer: panic handling a message; message delayed", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			_ = msg.NakWithDelay(d.busy())
		}
	}()
	h := msg.Headers()
	if pin := h.Get("Nats-Pin-Id"); pin != "" {
		p.setPin(pin)
	}
	if db := h.Get(outbox.HeaderDatabase); db != "" && db != d.dbID {
		d.foreignAt.Store(time.Now().UnixNano())
		d.m.skips.WithLabelValues("foreign_database").Inc()
		d.log.Error("deliverer: message of another outbox database left untouched",
			"err", (&ForeignDatabaseError{Where: "message", Ours: d.dbID, Their: db}).Error())
		_ = msg.NakWithDelay(max(d.s.ackWait, 30*time.Second))
		return
	}
	if items, bad, why, ok := splitBatch(msg); ok { // batchmsg.go
		if items == nil && bad == 0 {
			d.m.skips.WithLabelValues("bad_message").Inc()
			d.log.Error("deliverer: bad batch message terminated", "subject", msg.Subject(), "err", why)
			_ = msg.Term()
			return
		}
		if bad > 0 {
			d.m.skips.WithLabelValues("bad_message").Add(float64(bad))
			d.log.Error("deliverer: bad entries of a batch message terminated", "subject", msg.Subject(), "entries", bad, "err", why)
		}
		for _, it := range items {
			d.onMessage(work, p, it)
		}
		return
	}
	m, err := outbox.DecodeMessage(msg.Data())
	if err != nil {
		d.m.skips.WithLabelValues("bad_message").Inc()
		d.log.Error("deliverer: bad message terminated", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	key := laneKey(msg.Subject(), m)
	msg = decodedMsg{Msg: msg, m: m}
	switch mode, delay := d.lanes.join(key, msg, m.ItemID); mode {
	case laneQueued:
	case laneOverflow:
		d.overflow(msg, m, key, delay)
	case laneOwner:
		select {
		case d.sem <- struct{}{}:
		case <-work.Done():
		}
		if work.Err() != nil || !d.enter() {
			if work.Err() == nil {
				<-d.sem
			}
			for _, q := range append([]jetstream.Msg{msg}, d.lanes.drain(key)...) {
				d.m.skips.WithLabelValues("shutdown").Inc()
				_ = q.Nak()
			}
			return
		}
		go d.runLane(work, p, key, msg)
		if m.Dispatch > 1 && d.lanes.firstAdoption(key) {
			d.adopt(key, m.ItemID)
		}
	}
}
