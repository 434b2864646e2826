package deliverer

import (
	"context"
	"sync/atomic"
	"time"
)

// Claims, outcome writes and deferrals are batched opportunistically (group
// commit): a runner takes the first waiting call, adds every call already
// queued (up to AURORA_OUTBOX_BATCH_SIZE items, item ids unique) and runs
// one statement for all of them. A call is a lane's group of items and is
// never split. An idle deliverer pays no added latency; a busy one pays one
// Postgres round trip (and one WAL flush) per batch instead of per item.
//
// A busy runner also lingers: when the batch it ran last held more than
// one call, or the other runner of its kind is running a statement (calls
// are arriving faster than statements end), it waits up to
// AURORA_DELIVERER_BATCH_LINGER_MS (default 2) for more calls before
// running a batch that is not full. A statement's fixed cost is then paid
// for fuller batches (BENCHMARKS.md, "Batch linger"). A quiet runner (its
// last batch one call, no statement of its kind running) never waits, so
// an idle deliverer still pays nothing; 0 turns lingering off.
//
// batchRunners runners of each kind run in parallel. Fewer runners make
// fuller batches: a statement's fixed cost (~0.4 ms for a claim, ~0.7 ms
// for an outcome write, measured with pg_stat_statements on the demo) is
// paid once for what queued while the previous one ran. With 4 runners the
// stream demo claimed ~20 items a statement, with 1 ~69; 2 gave 5-21 % more
// items/s than 4 and 10-15 % less Postgres CPU; 1 was a few per cent better,
// but one statement stuck on a row lock would then stall every lane of the
// process (BENCHMARKS.md, "Batch runners").
const batchRunners = 2

// statementTimeout bounds one batched statement.
const statementTimeout = 30 * time.Second

type claimCall struct {
	items []claimRequest
	reply chan claimReply
}

type claimReply struct {
	rs  []claimResult // one per request, in order
	err error
}

type recordCall struct {
	rs    []record
	reply chan recordReply
}

type recordReply struct {
	errs []error // one per record: nil or outbox.ErrStaleLease (wrapped)
	err  error   // a database error for the whole call
}

type deferCall struct {
	items []deferRequest
	reply chan deferReply
}

type deferReply struct {
	moved map[int64]bool
	err   error
}

// claim queues items (one group) for the next claim batch and waits for the
// results, one per request in order.
func (d *Deliverer) claim(ctx context.Context, items []claimRequest) ([]claimResult, error) {
	c := claimCall{items: items, reply: make(chan claimReply, 1)}
	select {
	case d.claims <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	rep := <-c.reply // a runner always answers a call it took
	return rep.rs, rep.err
}

// record queues rs (one group) for the next outcome batch and waits for the
// result: one error per record, or a database error for all of them.
func (d *Deliverer) record(rs []record) ([]error, error) {
	c := recordCall{rs: rs, reply: make(chan recordReply, 1)}
	d.records <- c // runners outlive every worker (Run stops them last)
	rep := <-c.reply
	return rep.errs, rep.err
}

// deferToRelay queues items for the next deferral batch and returns the ids
// that moved.
func (d *Deliverer) deferToRelay(items []deferRequest) (map[int64]bool, error) {
	c := deferCall{items: items, reply: make(chan deferReply, 1)}
	d.defers <- c
	rep := <-c.reply
	return rep.moved, rep.err
}

// gather takes first and every call already waiting on ch while the batch
// has room (size items counted by n), skipping calls that share an item id
// with the batch (they are returned as later, for the next batch). With a
// non-nil linger it also waits for calls to arrive until linger fires or
// the batch is full; with nil it returns as soon as ch is empty.
func gather[C any](first C, ch <-chan C, limit int, ids func(C) []int64, linger <-chan time.Time) (batch, later []C) {
	batch = []C{first}
	seen := map[int64]bool{}
	n := 0
	for _, id := range ids(first) {
		seen[id] = true
		n++
	}
	for n < limit {
		var c C
		select {
		case c = <-ch:
		default:
			if linger == nil {
				return batch, later
			}
			select {
			case c = <-ch:
			case <-linger:
				return batch, later
			}
		}
		cids := ids(c)
		clash := false
		for _, id := range cids {
			if seen[id] {
				clash = true
				break
			}
		}
		if clash {
			later = append(later, c) // the same item twice: next batch
			continue
		}
		for _, id := range cids {
			seen[id] = true
		}
		n += len(cids)
		batch = append(batch, c)
	}
	return batch, later
}

// lingerer decides, for one batch runner, whether its next gather waits
// for more calls, and supplies the timer. A runner is busy (it lingers)
// when its last batch held more than one call or another runner of its
// kind is running a statement now: calls are then arriving faster than
// statements end. Otherwise (a quiet deliverer) it never waits. The runners
// of a kind gather one at a time (claimsGather, recordsGather): a runner
// waiting for its first call would otherwise take the calls a lingering
// one waits for, and both would run half-empty statements.
type lingerer struct {
	d         time.Duration // AURORA_DELIVERER_BATCH_LINGER_MS; 0 = never
	executing *atomic.Int32 // runners of this kind running a statement now
	busy      bool          // the last batch held more than one call
	timer     *time.Timer
}

// next returns the linger channel for the next gather: nil when quiet or
// off, else a timer of l.d started now.
func (l *lingerer) next() <-chan time.Time {
	if l.d <= 0 || !(l.busy || l.executing != nil && l.executing.Load() > 0) {
		return nil
	}
	if l.timer == nil {
		l.timer = time.NewTimer(l.d)
	} else {
		l.timer.Reset(l.d) // Go 1.23 timers: Reset drops a stale fire
	}
	return l.timer.C
}

// ran records the size (in calls) of the batch just gathered.
func (l *lingerer) ran(calls int) { l.busy = calls > 1 }

func claimIDs(c claimCall) []int64 {
	ids := make([]int64, len(c.items))
	for i, p := range c.items {
		ids[i] = p.ItemID
	}
	return ids
}

func recordIDs(c recordCall) []int64 {
	ids := make([]int64, len(c.rs))
	for i, r := range c.rs {
		ids[i] = r.Item.ItemID
	}
	return ids
}

func deferIDs(c deferCall) []int64 {
	ids := make([]int64, len(c.items))
	for i, r := range c.items {
		ids[i] = r.ItemID
	}
	return ids
}

// runClaims serves claim batches until stop is closed.
func (d *Deliverer) runClaims(stop <-chan struct{}) {
	var carry []claimCall
	linger := lingerer{d: d.s.batchLinger, executing: &d.claimsExecuting}
	for {
		var first claimCall
		d.claimsGather.Lock() // one runner gathers at a time (lingerer)
		if len(carry) > 0 {
			first, carry = carry[0], carry[1:]
		} else {
			select {
			case first = <-d.claims:
			case <-stop:
				d.claimsGather.Unlock()
				return
			}
		}
		batch, later := gather(first, d.claims, d.s.batch, claimIDs, linger.next())
		d.claimsGather.Unlock()
		linger.ran(len(batch))
		carry = append(carry, later...)
		p := claimParams{Now: d.clock.Override(), Exporter: d.exp.Name(), Lease: d.s.lease}
		for _, c := range batch {
			p.Items = append(p.Items, c.items...)
		}
		ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
		d.claimsExecuting.Add(1)
		rs, err := claimItems(ctx, d.db, p)
		d.claimsExecuting.Add(-1)
		cancel()
		off := 0
		for _, c := range batch {
			if err != nil {
				c.reply <- claimReply{err: err}
				continue
			}
			c.reply <- claimReply{rs: rs[off : off+len(c.items)]}
			off += len(c.items)
		}
	}
}

// runRecords serves outcome batches until stop is closed.
func (d *Deliverer) runRecords(stop <-chan struct{}) {
	linger := lingerer{d: d.s.batchLinger, executing: &d.recordsExecuting}
	for {
		var first recordCall
		d.recordsGather.Lock() // one runner gathers at a time (lingerer)
		select {
		case first = <-d.records:
		case <-stop:
			d.recordsGather.Unlock()
			return
		}
		batch, later := gather(first, d.records, d.s.batch, recordIDs, linger.next())
		d.recordsGather.Unlock()
		linger.ran(len(batch))
		d.writeRecords(batch)
		for _, c := range later { // rare: two leases of one item in one batch
			d.writeRecords([]recordCall{c})
		}
	}
}

func (d *Deliverer) writeRecords(batch []recordCall) {
	p := recordParams{Now: d.clock.Override()}
	for _, c := range batch {
		p.Records = append(p.Records, c.rs...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
	d.recordsExecuting.Add(1)
	errs, err := recordOutcomes(ctx, d.db, p)
	d.recordsExecuting.Add(-1)
	cancel()
	off := 0
	for _, c := range batch {
		if err != nil {
			c.reply <- recordReply{err: err}
			continue
		}
		c.reply <- recordReply{errs: errs[off : off+len(c.rs)]}
		off += len(c.rs)
	}
}

// runDefers serves deferral batches until stop is closed.
func (d *Deliverer) runDefers(stop <-chan struct{}) {
	for {
		var first deferCall
		select {
		case first = <-d.defers:
		case <-stop:
			return
		}
		batch, later := gather(first, d.defers, d.s.batch, deferIDs, nil) // rare: never lingers
		for _, b := range append([][]deferCall{batch}, splitEach(later)...) {
			p := deferParams{Now: d.clock.Override()}
			for _, c := range b {
				p.Items = append(p.Items, c.items...)
			}
			ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
			moved, err := deferItems(ctx, d.db, p)
			cancel()
			for _, c := range b {
				c.reply <- deferReply{moved: moved, err: err}
			}
		}
	}
}

func splitEach[C any](cs []C) [][]C {
	out := make([][]C, len(cs))
	for i, c := range cs {
		out[i] = []C{c}
	}
	return out
}
