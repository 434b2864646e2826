package deliverer

import (
	"context"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
)

// Claims and outcome writes are batched opportunistically (group commit):
// a runner takes the first waiting call, adds every call already queued (up
// to AURORA_OUTBOX_BATCH_SIZE items, item ids unique) and runs one statement
// for all of them. A call is a lane's group of items and is never split. An
// idle deliverer pays no added latency; a busy one pays one Postgres round
// trip (and one WAL flush) per batch instead of per item. batchRunners
// runners of each kind run in parallel.
const batchRunners = 4

type claimCall struct {
	ps    []claimParams
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
	errs   []error            // one per record: nil or outbox.ErrStaleLease (wrapped)
	handed [][]outbox.Message // one per record: messages handed to the slot it freed
	err    error              // a database error for the whole call
}

// claim queues ps (one group) for the next claim batch and waits for the
// results, one per request in order.
func (d *Deliverer) claim(ctx context.Context, ps []claimParams) ([]claimResult, error) {
	c := claimCall{ps: ps, reply: make(chan claimReply, 1)}
	select {
	case d.claims <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	rep := <-c.reply // a runner always answers a call it took
	return rep.rs, rep.err
}

// record queues rs (one group) for the next outcome batch and waits for the
// result: one error per record and the messages handed to the slots the
// records freed (recordOutcomes), or a database error for all of them.
func (d *Deliverer) record(rs []record) ([]error, [][]outbox.Message, error) {
	c := recordCall{rs: rs, reply: make(chan recordReply, 1)}
	d.records <- c // runners outlive every worker (Run stops them last)
	rep := <-c.reply
	return rep.errs, rep.handed, rep.err
}

// gather takes first and every call already waiting on ch while the batch
// has room (size items counted by n), skipping calls that share an item id
// with the batch (they are returned as later, for the next batch).
func gather[C any](first C, ch <-chan C, limit int, ids func(C) []int64) (batch, later []C) {
	batch = []C{first}
	seen := map[int64]bool{}
	n := 0
	for _, id := range ids(first) {
		seen[id] = true
		n++
	}
	for n < limit {
		select {
		case c := <-ch:
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
		default:
			return batch, later
		}
	}
	return batch, later
}

func claimIDs(c claimCall) []int64 {
	ids := make([]int64, len(c.ps))
	for i, p := range c.ps {
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

// runClaims serves claim batches until stop is closed.
func (d *Deliverer) runClaims(stop <-chan struct{}) {
	var carry []claimCall
	for {
		var first claimCall
		if len(carry) > 0 {
			first, carry = carry[0], carry[1:]
		} else {
			select {
			case first = <-d.claims:
			case <-stop:
				return
			}
		}
		batch, later := gather(first, d.claims, d.s.batch, claimIDs)
		carry = append(carry, later...)
		var ps []claimParams
		for _, c := range batch {
			ps = append(ps, c.ps...)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rs, err := claimItems(ctx, d.db, d.clock.Override(), d.exp.Name(), d.s.lease, ps)
		cancel()
		off := 0
		for _, c := range batch {
			if err != nil {
				c.reply <- claimReply{err: err}
				continue
			}
			c.reply <- claimReply{rs: rs[off : off+len(c.ps)]}
			off += len(c.ps)
		}
	}
}

// runRecords serves outcome batches until stop is closed.
func (d *Deliverer) runRecords(stop <-chan struct{}) {
	for {
		var first recordCall
		select {
		case first = <-d.records:
		case <-stop:
			return
		}
		batch, later := gather(first, d.records, d.s.batch, recordIDs)
		d.writeRecords(batch)
		for _, c := range later { // rare: two leases of one item in one batch
			d.writeRecords([]recordCall{c})
		}
	}
}

func (d *Deliverer) writeRecords(batch []recordCall) {
	var rs []record
	for _, c := range batch {
		rs = append(rs, c.rs...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	errs, handed, err := recordOutcomes(ctx, d.db, d.clock.Override(), rs, d.s.batch, d.s.lease)
	cancel()
	off := 0
	for _, c := range batch {
		if err != nil {
			c.reply <- recordReply{err: err}
			continue
		}
		c.reply <- recordReply{errs: errs[off : off+len(c.rs)], handed: handed[off : off+len(c.rs)]}
		off += len(c.rs)
	}
}
