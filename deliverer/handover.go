package deliverer

import (
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Handing a partition over. JetStream pins each partition consumer to one
// deliverer (the priority group's pinned client) and moves the pin to a
// standby when the owner stops pulling for the pinned TTL: a process
// paused (SIGSTOP, a VM stall, a long GC) or cut off from NATS. The paused
// owner still holds, in memory, its lanes' queued messages and the rest of
// a claimed group. If it went on with them when it resumed, it would call
// Stripe for a lane while the new owner calls for the same lane's newer
// messages: Stripe allows one concurrent meter event call per customer and
// meter and answers the second 429, a retry and a new generation for each
// (the first chaos long run saw 46,714 such overlaps and ten generations
// per item on its hot lanes). So once the old owner knows it lost the pin:
//
//   - a group not claimed yet is handed back untouched: its messages are
//     Nak'd at once and JetStream redelivers them to the pinned owner;
//   - the items of a claimed group not sent yet are not sent: each is
//     recorded as a retry due now with its attempt given back
//     (RuleHandedOver; attempts − 1 as for a correction's wait, so a pause
//     never spends the attempts limit or the horizon), so the relay
//     publishes it again at once, to the new owner;
//   - the call in flight, if any, ends as it would; its outcome is fenced
//     by lease_token as always.
//
// It knows from either of two signals: a pull refused with "pin ID
// mismatch" (status 423: JetStream pinned another client), or an attach
// check (every 2 s) reading the consumer's pinned client and finding
// another id than the last one JetStream gave us. It forgets when a message
// arrives under a new pin (JetStream pinned us again) or an attach check
// finds our pin current, so a mistaken signal costs at most one check
// interval of hand-backs, never a lane stuck handing back.

// RuleHandedOver is the attempt row's error_code (and Result.Rule) of an
// item claimed but not sent because its partition was pinned to another
// deliverer meanwhile.
const RuleHandedOver = "partition_handed_over"

// lose records that the pin this process last received for partition p is
// no longer JetStream's choice.
func (p *partition) lose() {
	p.mu.Lock()
	if p.pin != "" {
		p.lostPin = p.pin
	}
	p.mu.Unlock()
}

// keep records that JetStream still pins partition p to this process.
func (p *partition) keep() {
	p.mu.Lock()
	p.lostPin = ""
	p.mu.Unlock()
}

// handedOver reports whether partition p was pinned to another deliverer
// since this process last received a message of it under a new pin.
func (p *partition) handedOver() bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lostPin != ""
}

// handBack Naks msgs (a group of a partition handed over, not claimed) so
// JetStream redelivers them to the partition's owner at once.
func (d *Deliverer) handBack(msgs []jetstream.Msg) {
	for _, m := range msgs {
		d.m.skips.WithLabelValues(skipHandedOver).Inc()
		_ = m.Nak()
	}
}

// skipHandedOver labels aurora_deliverer_messages_skipped_total for a
// message handed back to a partition's new owner.
const skipHandedOver = "handed_over"

// handedOverRecord is the record of claimed item c not sent because its
// partition was handed over: a retry due now, the attempt given back.
func handedOverRecord(c claimed) record {
	return record{Item: c, Outcome: OutcomeRetry, Wait: true,
		LastError: fmt.Sprintf("%s: the partition was pinned to another deliverer; not sent", RuleHandedOver),
		Result:    Result{Outcome: OutcomeRetry, Rule: RuleHandedOver, ErrorCode: RuleHandedOver}}
}
