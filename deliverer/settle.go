package deliverer

import (
	"time"
)

// complete writes a group's outcomes in one fenced statement (batched with
// other groups') and settles each message: acked when the outcome was
// written; left alone when the lease fence refused it as stale; handed back
// when Postgres did not take it.
//
// Left alone, not acked: JetStream settles a message by its stream sequence
// whatever delivery the ack came with, so a refused holder's ack would drop
// the message a redelivery gave the current holder, and an item whose
// current holder then dies would wait, leased, for the relay's re-dispatch
// interval. Unsettled, the message goes on with its current delivery; if
// nobody holds it, JetStream redelivers it after the ack wait and the claim
// acks it (terminal, or of an older dispatch) or claims the item.
func (d *Deliverer) complete(msgs []groupMsg, crs []claimResult, recs []record) {
	errs, err := d.record(recs)
	for i, rec := range recs {
		c, msg := rec.Item, msgs[i].msg
		if err == nil {
			switch err := errs[i]; {
			case err == nil:
				d.m.outcomes.WithLabelValues(string(rec.Outcome), string(rec.Reason)).Inc()
				d.log.Info("deliverer: outcome", "item", c.ItemID, "key_prefix", keyPrefix(c.Key), "attempt", c.Attempts,
					"lease_token", c.LeaseToken, "outcome", string(rec.Outcome), "reason", string(rec.Reason),
					"rule", rec.Result.Rule, "http_status", rec.Result.HTTPStatus)
				_ = msg.Ack()
			case isStale(err):
				d.m.staleLeases.Inc()
				d.m.outcomes.WithLabelValues(string(OutcomeStaleLease), "").Inc()
				d.log.Warn("deliverer: stale lease; outcome not written", "item", c.ItemID, "key_prefix", keyPrefix(c.Key),
					"lease_token", c.LeaseToken, "would_be", string(rec.Outcome))
			default:
				d.m.errors.WithLabelValues("record").Inc()
				_ = msg.NakWithDelay(d.busy())
			}
			continue
		}
		// Postgres did not take the outcome: the row stays leased to us
		// until the lease expires, then is reclaimed and resent with the
		// same key (Stripe collapses it). Come back then.
		d.m.errors.WithLabelValues("record").Inc()
		d.log.Error("deliverer: record outcome failed; item will be reclaimed after its lease", "item", c.ItemID, "err", err)
		_ = msg.NakWithDelay(max(c.LeaseExpiresAt.Sub(crs[i].Now), d.s.busyDelay) + d.s.busyDelay)
	}
}

// settle hands back or acknowledges the message of an item that was not
// claimed, according to why.
func (d *Deliverer) settle(g groupMsg, cr claimResult) {
	m := g.m
	back := func(why string, delay time.Duration) {
		_ = g.msg.NakWithDelay(delay)
		d.m.skips.WithLabelValues(why).Inc()
	}
	switch cr.Verdict {
	case verdictNotFound, verdictMismatch:
		d.m.skips.WithLabelValues(cr.Verdict.String()).Inc()
		d.log.Error("deliverer: message names no matching item; terminated", "item", m.ItemID, "key_prefix", keyPrefix(m.Key), "why", cr.Verdict.String())
		_ = g.msg.Term()
	case verdictTerminal, verdictStaleDispatch:
		d.m.skips.WithLabelValues(cr.Verdict.String()).Inc()
		_ = g.msg.Ack()
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
	case verdictLocked:
		back(cr.Verdict.String(), d.busy())
	default:
		// verdictClaimed (claimed items are attempted, never settled here)
		// or an unknown verdict: a programming error must not kill the
		// process; hand the message back.
		d.m.errors.WithLabelValues("verdict").Inc()
		d.log.Error("deliverer: unexpected verdict; message delayed", "item", m.ItemID, "verdict", cr.Verdict.String())
		_ = g.msg.NakWithDelay(d.busy())
	}
}
