package deliverer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

// A lane is one (destination account, Stripe customer, meter): Stripe
// allows one concurrent meter event call per customer and meter. The relay
// publishes every message of a lane on one partition and JetStream pins
// each partition to one deliverer, so a lane's messages all arrive in one
// process; there, one goroutine at a time runs a lane (runLane), in groups:
// the messages that queued while a group was being handled form the next
// group, which is claimed in one statement, sent one call at a time and
// recorded in one statement. Lanes run in parallel, up to
// AURORA_DELIVERER_CONCURRENCY at once.
//
// A lane's share: a lane holds at most laneShare messages in this process
// (running and queued; twice AURORA_OUTBOX_BATCH_SIZE by default). A
// message beyond it is deferred: its row gets a new dispatch due when the
// lane is expected to have worked through what it holds (deferQuery) and
// the message is acked, so a tenant's burst never fills the partition's
// ack-pending window and the other lanes of the partition keep flowing;
// the relay publishes the deferred items again when they are due.
//
// Adoption: an owner that dies or loses its partition takes its memory
// of deferred items with it, and its successor would get them only at
// their estimates (one per 50 ms for an unmeasured lane: a burst drained at
// a few items a second after its owner was killed). So the first message
// of a later dispatch (dispatch > 1) that starts a lane this process never
// deferred for makes it adopt the lane's deferred rows once (adoptQuery:
// the same tenant, feature, account and exporter, pending, unpublished,
// due later, never attempted — a row in a retry's backoff is never
// brought forward); they join the lane's memory and are recalled like its
// own.
//
// Recall: the due time is only an estimate (a lane not measured yet is
// assumed at 50 ms an item, ten times what a 0 ms provider costs), so the
// owner also remembers what its lane deferred and, once the lane holds no
// more than half its share, recalls up to its free room of them: their rows
// become due now and the relay is woken (recallQuery). A recalled row that
// moved on meanwhile is left alone; an owner that dies or loses the
// partition recalls nothing and the estimate stands, so recall only ever
// brings a row forward. Without it a 0 ms demo's busiest lane sat idle for
// ten seconds and then drained at the estimate's one item per 50 ms.
type lanes struct {
	share int

	mu sync.Mutex
	m  map[string]*lane
	// perItem remembers, across a lane's idle gaps, how long its items
	// take (an EWMA), for the deferral delay.
	perItem map[string]time.Duration
	// parked holds a closed lane's deferred items not recalled yet (the
	// lane emptied with more deferred than its share): its next runner
	// inherits them.
	parked map[string][]deferredItem
	// adopted: lanes this process has deferred for or adopted (see
	// Adoption), so a lane is adopted at most once.
	adopted map[string]bool
}

type lane struct {
	queue       []jetstream.Msg
	running     int            // messages in the group being handled
	deferredTil time.Time      // when the items deferred so far are expected to be worked
	deferred    []deferredItem // deferred by this process, not recalled yet, oldest first
}

// deferredItem is a row a lane deferred: its id and the dispatch the
// deferral gave it (the recall moves the row only at that dispatch).
type deferredItem struct {
	ID       int64
	Dispatch int32
}

// maxRemembered bounds the deferred items a lane remembers for recall
// (beyond it, an item keeps its estimated due time); maxParked bounds the
// closed lanes whose deferred items are kept.
const (
	maxRemembered = 50_000
	maxParked     = 10_000
)

// defaultPerItem is the per-item time assumed for a lane not measured yet.
const defaultPerItem = 50 * time.Millisecond

// maxDeferral bounds one deferral.
const maxDeferral = 10 * time.Minute

// laneMode is what join decided.
type laneMode int

const (
	laneOwner    laneMode = iota // no lane ran: the caller starts runLane with msg
	laneQueued                   // queued behind the running group
	laneOverflow                 // the lane holds its share: defer msg by the returned delay
)

func newLanes(share int) *lanes {
	return &lanes{share: share, m: map[string]*lane{}, perItem: map[string]time.Duration{}, parked: map[string][]deferredItem{}, adopted: map[string]bool{}}
}

// laneKey is the message's lane token (outbox.Message.Lane) under its
// subject's exporter and tenant; a message without one (published by an
// older relay) gets the lane of its subject and feature.
func laneKey(subject string, m outbox.Message) string {
	if m.Lane != "" {
		return m.Lane
	}
	return subject + "|" + m.Feature
}

// join decides how msg (naming item) runs: as the start of a new lane for
// key, queued behind the lane's running group, or deferred by the returned
// delay (the lane holds its share).
func (l *lanes) join(key string, msg jetstream.Msg, _ int64) (laneMode, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln, ok := l.m[key]
	if !ok {
		l.m[key] = &lane{running: 1, deferred: l.parked[key]}
		delete(l.parked, key)
		return laneOwner, 0
	}
	held := ln.running + len(ln.queue)
	if held < l.share {
		ln.queue = append(ln.queue, msg)
		return laneQueued, 0
	}
	per := l.perItem[key]
	if per == 0 {
		per = defaultPerItem
	}
	now := time.Now()
	at := now.Add(time.Duration(held) * per)
	if ln.deferredTil.After(at) {
		at = ln.deferredTil
	}
	at = at.Add(per)
	if at.Sub(now) > maxDeferral {
		at = now.Add(maxDeferral)
	}
	ln.deferredTil = at
	return laneOverflow, at.Sub(now)
}

// push queues msg on key's lane whatever its share (a deferral that did not
// move the row: the claim decides it); it reports false when the lane no
// longer runs (the caller starts one).
func (l *lanes) push(key string, msg jetstream.Msg) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln, ok := l.m[key]
	if !ok {
		return false
	}
	ln.queue = append(ln.queue, msg)
	return true
}

// nextGroup returns up to limit queued messages, oldest first, as the
// lane's next group, or nil after closing the lane; and the deferred items
// to recall now (the lane holds at most half its share: up to its free
// room of them, oldest first).
func (l *lanes) nextGroup(key string, limit int) ([]jetstream.Msg, []deferredItem) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln := l.m[key]
	if ln == nil {
		return nil, nil
	}
	n := min(max(limit, 1), len(ln.queue))
	var out []jetstream.Msg
	if n > 0 {
		out = make([]jetstream.Msg, n)
		copy(out, ln.queue[:n])
		clear(ln.queue[:n])
		ln.queue = ln.queue[n:]
	}
	ln.running = n
	recall := l.recallLocked(ln)
	if n == 0 {
		delete(l.m, key)
		if len(ln.deferred) > 0 && len(l.parked) < maxParked {
			l.parked[key] = ln.deferred
		}
	}
	return out, recall
}

// recallLocked takes the deferred items ln has room for, when it holds at
// most half its share.
func (l *lanes) recallLocked(ln *lane) []deferredItem {
	held := ln.running + len(ln.queue)
	if len(ln.deferred) == 0 || held > l.share/2 {
		return nil
	}
	k := min(len(ln.deferred), l.share-held)
	out := append([]deferredItem(nil), ln.deferred[:k]...)
	ln.deferred = ln.deferred[k:]
	if len(ln.deferred) == 0 {
		ln.deferred = nil
		ln.deferredTil = time.Time{}
	}
	return out
}

// firstAdoption reports whether key's lane is to be adopted now: true
// once per lane and process (a lane this process deferred for is its own).
func (l *lanes) firstAdoption(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.adopted[key] {
		return false
	}
	if len(l.adopted) >= maxParked*10 { // bound the memory: a lane seen again may be adopted again
		clear(l.adopted)
	}
	l.adopted[key] = true
	return true
}

// adoptDeferred adds items (deferred by another owner) to key's lane memory
// and returns those to recall now; a closed lane parks them.
func (l *lanes) adoptDeferred(key string, items []deferredItem) []deferredItem {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln := l.m[key]
	if ln == nil {
		if len(l.parked) < maxParked {
			l.parked[key] = append(l.parked[key], items...)
		}
		return nil
	}
	for _, it := range items {
		if len(ln.deferred) >= maxRemembered {
			break
		}
		ln.deferred = append(ln.deferred, it)
	}
	return l.recallLocked(ln)
}

// remember records that key's lane deferred it; it returns the items to
// recall at once (the lane closed meanwhile, or has room again).
func (l *lanes) remember(key string, it deferredItem) []deferredItem {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.adopted[key] = true
	ln := l.m[key]
	if ln == nil {
		return []deferredItem{it}
	}
	if len(ln.deferred) < maxRemembered {
		ln.deferred = append(ln.deferred, it)
	}
	return l.recallLocked(ln)
}

// observe folds a group's time per item into the lane's estimate.
func (l *lanes) observe(key string, took time.Duration, items int) {
	if items < 1 {
		return
	}
	per := took / time.Duration(items)
	l.mu.Lock()
	defer l.mu.Unlock()
	if old := l.perItem[key]; old > 0 {
		per = (3*old + per) / 4
	}
	if len(l.perItem) > 100_000 { // bound the memory of idle lanes
		clear(l.perItem)
	}
	l.perItem[key] = per
}

// drain closes the lane and returns its queued messages.
func (l *lanes) drain(key string) []jetstream.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln := l.m[key]
	delete(l.m, key)
	if ln == nil {
		return nil
	}
	return ln.queue
}

// drainAll closes every lane and returns the queued messages.
func (l *lanes) drainAll() []jetstream.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []jetstream.Msg
	for k, ln := range l.m {
		out = append(out, ln.queue...)
		delete(l.m, k)
	}
	return out
}

// heartbeat sends InProgress for every queued message every interval until
// stop is closed, so JetStream does not redeliver a message while it waits
// behind its lane's running group (the running group heartbeats its own).
func (l *lanes) heartbeat(every time.Duration, stop <-chan struct{}, m *metrics) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		var queued []jetstream.Msg
		for _, ln := range l.m {
			queued = append(queued, ln.queue...)
		}
		l.mu.Unlock()
		for _, msg := range queued {
			if err := msg.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				m.errors.WithLabelValues("in_progress").Inc()
			}
		}
	}
}

// runLane runs key's lane: first, then each next group until the lane is
// empty. Once Run stops, the group being handled finishes and what is
// still queued goes back to JetStream.
func (d *Deliverer) runLane(work context.Context, p *partition, key string, first jetstream.Msg) {
	defer d.wg.Done()
	defer func() { <-d.sem }()
	for g := []jetstream.Msg{first}; g != nil; {
		if d.isStopping() {
			for _, m := range g {
				d.m.skips.WithLabelValues("shutdown").Inc()
				_ = m.Nak()
			}
			g, _ = d.lanes.nextGroup(key, d.s.batch) // stopping: nothing recalled
			continue
		}
		start := time.Now()
		d.runGroup(work, p, g)
		d.lanes.observe(key, time.Since(start), len(g))
		var recall []deferredItem
		g, recall = d.lanes.nextGroup(key, d.s.batch)
		d.recall(recall)
	}
}

// runGroup handles one group, recovering a panic: the group's unsettled
// messages are handed back (a settled one refuses the Nak), counted and
// logged, and the lane goes on.
func (d *Deliverer) runGroup(work context.Context, p *partition, g []jetstream.Msg) {
	defer func() {
		if r := recover(); r != nil {
			d.m.errors.WithLabelValues("panic").Inc()
			d.log.Error("deliverer: panic handling a group; messages delayed", "messages", len(g), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			for _, m := range g {
				_ = m.NakWithDelay(d.busy())
			}
		}
	}()
	d.handleGroup(work, p, g)
}

// overflow defers msg (its lane holds its share) by delay: the row gets a
// new dispatch due then and the message is acked. A row the deferral did
// not move (leased, of another dispatch, terminal) is queued on its lane
// anyway and decided by the claim.
func (d *Deliverer) overflow(msg jetstream.Msg, m outbox.Message, key string, delay time.Duration) {
	if !d.enter() {
		d.m.skips.WithLabelValues("shutdown").Inc()
		_ = msg.Nak()
		return
	}
	go func() {
		defer d.wg.Done()
		moved, err := d.deferToRelay([]deferRequest{{ItemID: m.ItemID, Dispatch: m.Dispatch, Delay: delay}})
		switch {
		case err != nil:
			d.m.errors.WithLabelValues("defer").Inc()
			d.log.Warn("deliverer: deferral failed; message delayed", "item", m.ItemID, "err", err)
			_ = msg.NakWithDelay(delay)
		case moved[m.ItemID]:
			d.m.skips.WithLabelValues("deferred").Inc()
			_ = msg.Ack()
			d.recall(d.lanes.remember(key, deferredItem{ID: m.ItemID, Dispatch: m.Dispatch + 1}))
		case !d.lanes.push(key, msg):
			// The lane finished meanwhile: hand the message back for at once.
			_ = msg.NakWithDelay(d.busy())
		}
	}()
}

// recall brings items forward (recallQuery) on its own goroutine, so the
// lane does not wait for it; while stopping it does nothing and the
// deferral's estimate stands. A failed recall is counted and logged: the
// items are still due at their estimate, nothing is lost.
func (d *Deliverer) recall(items []deferredItem) {
	if len(items) == 0 || !d.enter() {
		return
	}
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
		defer cancel()
		n, err := recallItems(ctx, d.db, recallParams{Now: d.clock.Override(), Items: items})
		if err != nil {
			d.m.errors.WithLabelValues("recall").Inc()
			d.log.Warn("deliverer: recall of deferred items failed; they stay due at their estimate", "items", len(items), "err", err)
			return
		}
		d.m.recalled.Add(float64(n))
	}()
}

// adopt reads the deferred rows of the lane of item (adoptQuery) on its
// own goroutine and adds them to key's lane memory (Adoption). A failure
// is counted and logged: the rows stay due at their estimates.
func (d *Deliverer) adopt(key string, item int64) {
	if !d.enter() {
		return
	}
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
		defer cancel()
		items, err := adoptItems(ctx, d.db, adoptParams{Now: d.clock.Override(), ItemID: item, Limit: maxRemembered})
		if err != nil {
			d.m.errors.WithLabelValues("adopt").Inc()
			d.log.Warn("deliverer: adopting a lane's deferred items failed; they stay due at their estimate", "item", item, "err", err)
			return
		}
		if len(items) > 0 {
			d.recall(d.lanes.adoptDeferred(key, items))
		}
	}()
}
