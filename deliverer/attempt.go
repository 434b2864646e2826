package deliverer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

// groupMsg is one message of a group being handled.
type groupMsg struct {
	msg jetstream.Msg
	m   outbox.Message
}

// decodedMsg is a message onMessage has decoded, with its body: it goes
// through the lanes as a jetstream.Msg and handleGroup does not decode it
// again (the body's JSON was ~2 % of the demo process, decoded twice).
type decodedMsg struct {
	jetstream.Msg
	m outbox.Message
}

// decodeMsg returns msg's body: the one onMessage decoded, else decoded now
// (outbox.ErrBadMessage when malformed).
func decodeMsg(msg jetstream.Msg) (outbox.Message, error) {
	if d, ok := msg.(decodedMsg); ok {
		return d.m, nil
	}
	return outbox.DecodeMessage(msg.Data())
}

// lockedWaitLimit bounds how long a group keeps re-claiming items whose row
// another transaction holds locked (pauses of 1, 2, 4 and 8 ms): typically
// the relay, whose PubAck mark commits within milliseconds. Past it the
// message goes back to JetStream for the busy delay.
const lockedWaitLimit = 16 * time.Millisecond

// handleGroup handles a lane's group of messages: decode; claim every item
// in one statement; pre-send checks and provider calls one at a time, in
// order; the outcomes in one fenced statement; then each message is
// settled. Items whose row another transaction holds are claimed again
// after 1, 2, 4 and 8 ms before their message goes back to JetStream. A
// group of partition p after p was pinned to another deliverer is handed
// back unclaimed (handover.go).
func (d *Deliverer) handleGroup(ctx context.Context, p *partition, msgs []jetstream.Msg) {
	if p.handedOver() {
		d.handBack(msgs)
		return
	}
	stopBeat := d.heartbeat(msgs)
	defer stopBeat()
	todo := make([]groupMsg, 0, len(msgs))
	seen := make(map[int64]bool, len(msgs))
	for _, msg := range msgs {
		m, err := decodeMsg(msg)
		if err != nil { // onMessage terminated bad bodies; be safe anyway
			d.m.skips.WithLabelValues("bad_message").Inc()
			_ = msg.Term()
			continue
		}
		if seen[m.ItemID] { // two messages of one item in a group: the later one waits
			d.m.skips.WithLabelValues(verdictLocked.String()).Inc()
			_ = msg.NakWithDelay(d.busy())
			continue
		}
		seen[m.ItemID] = true
		todo = append(todo, groupMsg{msg: msg, m: m})
	}
	for wait := time.Duration(0); len(todo) > 0; wait = max(2*wait, time.Millisecond) {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		reqs := make([]claimRequest, len(todo))
		for i, g := range todo {
			reqs[i] = claimRequest{ItemID: g.m.ItemID, Dispatch: g.m.Dispatch, Key: g.m.Key}
		}
		crs, err := d.claim(ctx, reqs)
		if err != nil {
			d.m.errors.WithLabelValues("claim").Inc()
			d.claimErrs.Add(1)
			d.claimErrLog.Do(func() {
				d.log.Error("deliverer: claim failed; messages delayed", "items", len(todo), "err", err,
					"failures_since_last_line", d.claimErrs.Swap(0), "at_most_every", claimErrLogEvery)
			})
			for _, g := range todo {
				_ = g.msg.NakWithDelay(d.busy())
			}
			return
		}
		var won []groupMsg
		var wonCR []claimResult
		var again []groupMsg
		for i, cr := range crs {
			g := todo[i]
			switch {
			case cr.Verdict == verdictClaimed:
				won, wonCR = append(won, g), append(wonCR, cr)
			case cr.Verdict == verdictLocked && wait < lockedWaitLimit && ctx.Err() == nil:
				again = append(again, g)
			default:
				d.log.Debug("deliverer: not claimed", "item", g.m.ItemID, "dispatch", g.m.Dispatch, "why", cr.Verdict.String())
				d.settle(g, cr)
			}
		}
		if len(won) > 0 {
			d.attempt(ctx, p, won, wonCR)
		}
		todo = again
	}
}

// heartbeat sends InProgress for every message of msgs every third of
// AckWait until stopped, so JetStream does not redeliver a message while
// its group runs.
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
// group in order, then writes the outcomes in one fenced statement and
// settles each message (complete). The first item is always attempted; a
// later one whose call could outlast the lease budget is not sent and is
// recorded as a retry due at once (same key, next dispatch), and so is one
// not sent because partition p was pinned to another deliverer meanwhile,
// its attempt given back (handover.go).
//
// A stream account's items are not sent one call each: the group's items
// that pass their checks go to the exporter at once, and it sends them
// (with other lanes') in one request of up to 100 events: ExportGroup when
// the exporter is a GroupExporter (the group is never split across
// concurrent requests), else one concurrent Export per item. The lane still
// runs one group at a time.
func (d *Deliverer) attempt(ctx context.Context, p *partition, msgs []groupMsg, crs []claimResult) {
	start := time.Now()
	recs := make([]record, len(crs))
	ge, grouped := d.exp.(GroupExporter)
	var wg sync.WaitGroup
	var send []int // stream items of the group that passed their checks (grouped)
	for i, cr := range crs {
		if cr.Item.Ctx.Exporter != ExporterStream {
			continue
		}
		if grouped && cr.Item.Item.SubjectKind != identity.SubjectCorrection {
			rec, ok := d.precheck(cr)
			if ok {
				send = append(send, i)
			} else {
				recs[i] = rec
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs[i] = d.decide(ctx, cr)
		}()
	}
	if len(send) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs := make([]claimed, len(send))
			for j, i := range send {
				cs[j] = crs[i].Item
			}
			for j, res := range d.callGroup(ctx, ge, cs) {
				recs[send[j]] = d.withResult(cs[j], res)
			}
		}()
	}
	for i, cr := range crs {
		if cr.Item.Ctx.Exporter == ExporterStream {
			continue
		}
		if p.handedOver() {
			recs[i] = handedOverRecord(cr.Item)
			d.m.skips.WithLabelValues(skipHandedOver).Inc()
			continue
		}
		if i > 0 && time.Since(start)+d.s.providerTimeout > d.leaseBudget() {
			recs[i] = record{Item: cr.Item, Outcome: OutcomeRetry,
				LastError: fmt.Sprintf("lease_budget: group ran %s of a %s lease; not sent", time.Since(start).Round(time.Millisecond), d.s.lease)}
			continue
		}
		recs[i] = d.decide(ctx, cr)
	}
	wg.Wait()
	d.complete(msgs, crs, recs)
}

// decide runs the horizon, attempts and pre-send checks for a claimed item
// and, when they pass, the provider call; it returns the record to write.
func (d *Deliverer) decide(ctx context.Context, cr claimResult) record {
	rec, ok := d.precheck(cr)
	if !ok {
		return rec
	}
	if cr.Item.Item.SubjectKind == identity.SubjectCorrection {
		return d.correct(ctx, cr)
	}
	return d.withResult(cr.Item, d.call(ctx, cr.Item))
}

// precheck runs the horizon, attempts and pre-send checks for a claimed
// item: ok when it may be sent, else the record to write (not sent).
func (d *Deliverer) precheck(cr claimResult) (rec record, ok bool) {
	c := cr.Item
	rec = record{Item: c}
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
		return rec, true
	}
	return rec, false
}

// withResult returns the record of c after the provider answered res: the
// outcome, and for a retry its backoff, or uncertain once the attempts are
// spent.
func (d *Deliverer) withResult(c claimed, res Result) record {
	rec := record{Item: c, Result: res, Outcome: res.Outcome, Reason: res.Reason}
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
	return rec
}

// request is the provider request of c: a pure function of its row and
// meter mapping.
func request(c claimed) Request {
	return Request{
		ItemID: c.ItemID, Account: c.Account, Via: c.Ctx.Exporter, Key: c.Key, EventName: *c.Ctx.EventName,
		CustomerKey: deref(c.Ctx.CustomerKey, "stripe_customer_id"), ValueKey: deref(c.Ctx.ValueKey, "value"),
		Customer: *c.Ctx.StripeCustomer, Value: c.Item.Quantity, Timestamp: c.Item.OccurredAt,
	}
}

// call sends one request with the provider deadline and records metrics.
// An exporter that panics is a failed call (uncertain: nobody knows whether
// it was sent), not a dead process.
func (d *Deliverer) call(ctx context.Context, c claimed) Result {
	req := request(c)
	return d.guarded(ctx, c.ItemID, func(ctx context.Context) Result { return d.exp.Export(ctx, req) })
}

// guarded runs one provider call f with the provider deadline and records
// metrics. An exporter that panics is a failed call (uncertain: nobody
// knows whether it was sent), not a dead process.
func (d *Deliverer) guarded(ctx context.Context, itemID int64, f func(context.Context) Result) (res Result) {
	cctx, cancel := context.WithTimeout(ctx, d.s.providerTimeout)
	defer cancel()
	d.m.inFlight.Inc()
	defer d.m.inFlight.Dec()
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			d.m.errors.WithLabelValues("panic").Inc()
			d.log.Error("deliverer: exporter panicked; outcome uncertain", "item", itemID, "panic", fmt.Sprint(r))
			res = Result{Outcome: OutcomeUncertain, Rule: "exporter_panic"}
		}
		d.m.latency.WithLabelValues(string(res.Outcome)).Observe(time.Since(start).Seconds())
	}()
	return sanitize(f(cctx))
}

// callGroup sends a lane's items as one unit (GroupExporter) within one
// provider deadline and returns one result per item, in order. A panic or
// a wrong number of results makes every item uncertain.
func (d *Deliverer) callGroup(ctx context.Context, ge GroupExporter, cs []claimed) (res []Result) {
	reqs := make([]Request, len(cs))
	for i, c := range cs {
		reqs[i] = request(c)
	}
	cctx, cancel := context.WithTimeout(ctx, d.s.providerTimeout)
	defer cancel()
	n := float64(len(cs))
	d.m.inFlight.Add(n)
	defer d.m.inFlight.Sub(n)
	start := time.Now()
	uncertain := func(rule string) []Result {
		out := make([]Result, len(cs))
		for i := range out {
			out[i] = Result{Outcome: OutcomeUncertain, Rule: rule}
		}
		return out
	}
	defer func() {
		if r := recover(); r != nil {
			d.m.errors.WithLabelValues("panic").Inc()
			d.log.Error("deliverer: exporter panicked; outcomes uncertain", "items", len(cs), "panic", fmt.Sprint(r))
			res = uncertain("exporter_panic")
		}
		took := time.Since(start).Seconds()
		for _, r := range res {
			d.m.latency.WithLabelValues(string(r.Outcome)).Observe(took)
		}
	}()
	out := ge.ExportGroup(cctx, reqs)
	if len(out) != len(reqs) {
		return uncertain(fmt.Sprintf("invalid_result(%d results for %d requests)", len(out), len(reqs)))
	}
	for i := range out {
		out[i] = sanitize(out[i])
	}
	return out
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
