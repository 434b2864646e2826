package deliverer

import (
	"context"
	"time"
)

// Claims and outcome writes are batched opportunistically (group commit):
// a runner takes the first waiting request, adds every request already
// queued (up to AURORA_OUTBOX_BATCH_SIZE, item ids unique) and runs one
// statement for all of them. An idle deliverer pays no added latency; a busy
// one pays one Postgres round trip (and one WAL flush) per batch instead of
// per item. batchRunners runners of each kind run in parallel.
const batchRunners = 4

type claimCall struct {
	p     claimParams
	reply chan claimReply
}

type claimReply struct {
	r   claimResult
	err error
}

type recordCall struct {
	r     record
	reply chan error // nil, outbox.ErrStaleLease (wrapped), or a database error
}

// claim queues p for the next claim batch and waits for its result.
func (d *Deliverer) claim(ctx context.Context, p claimParams) (claimResult, error) {
	c := claimCall{p: p, reply: make(chan claimReply, 1)}
	select {
	case d.claims <- c:
	case <-ctx.Done():
		return claimResult{}, ctx.Err()
	}
	rep := <-c.reply // a runner always answers a call it took
	return rep.r, rep.err
}

// record queues r for the next outcome batch and waits for its result.
func (d *Deliverer) record(r record) error {
	c := recordCall{r: r, reply: make(chan error, 1)}
	d.records <- c // runners outlive every worker (Run stops them last)
	return <-c.reply
}

// runClaims serves claim batches until stop is closed.
func (d *Deliverer) runClaims(stop <-chan struct{}) {
	var carry []claimCall
	for {
		var batch []claimCall
		if len(carry) > 0 {
			batch, carry = carry[:1], carry[1:]
		} else {
			select {
			case c := <-d.claims:
				batch = append(batch, c)
			case <-stop:
				return
			}
		}
		seen := map[int64]bool{batch[0].p.ItemID: true}
	drain:
		for len(batch) < d.s.batch {
			select {
			case c := <-d.claims:
				if seen[c.p.ItemID] {
					carry = append(carry, c) // the same item twice: next batch
					continue
				}
				seen[c.p.ItemID] = true
				batch = append(batch, c)
			default:
				break drain
			}
		}
		ps := make([]claimParams, len(batch))
		for i, c := range batch {
			ps[i] = c.p
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rs, err := claimItems(ctx, d.db, d.clock.Override(), d.exp.Name(), d.s.lease, ps)
		cancel()
		for i, c := range batch {
			if err != nil {
				c.reply <- claimReply{err: err}
			} else {
				c.reply <- claimReply{r: rs[i]}
			}
		}
	}
}

// runRecords serves outcome batches until stop is closed.
func (d *Deliverer) runRecords(stop <-chan struct{}) {
	for {
		var batch []recordCall
		select {
		case c := <-d.records:
			batch = append(batch, c)
		case <-stop:
			return
		}
		seen := map[int64]bool{batch[0].r.Item.ItemID: true}
		var later []recordCall
	drain:
		for len(batch) < d.s.batch {
			select {
			case c := <-d.records:
				if seen[c.r.Item.ItemID] {
					later = append(later, c)
					continue
				}
				seen[c.r.Item.ItemID] = true
				batch = append(batch, c)
			default:
				break drain
			}
		}
		d.writeRecords(batch)
		for _, c := range later { // rare: two leases of one item in one batch
			d.writeRecords([]recordCall{c})
		}
	}
}

func (d *Deliverer) writeRecords(batch []recordCall) {
	rs := make([]record, len(batch))
	for i, c := range batch {
		rs[i] = c.r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	errs, err := recordOutcomes(ctx, d.db, d.clock.Override(), rs)
	cancel()
	for i, c := range batch {
		if err != nil {
			c.reply <- err
		} else {
			c.reply <- errs[i]
		}
	}
}
