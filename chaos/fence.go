package chaos

import (
	"context"
	"fmt"
	"sort"

	"github.com/aurora-billing/aurora/shared/outbox"
)

// checkFence states invariant 4, the lease-token fence: an outcome is
// written only while its holder still holds the lease. In the attempt
// table (one row per item and lease_token, started_at = the claim's
// database time, finished_at = the outcome's) that reads: no attempt with
// a real outcome (anything but stale_lease, which is what a fenced-off
// write and a take-over record) finished after a later lease of the same
// item was claimed; and every accepted or confirmed item has exactly one
// accepted attempt, under its current lease_token. A holder that woke up
// after its lease was taken over and wrote anyway breaks the first; one
// that overwrote a later holder's outcome breaks the second.
func (r *run) checkFence(ctx context.Context, rep *Report) error {
	err := r.pool.QueryRow(ctx, `
SELECT count(DISTINCT a.item_id)
FROM outbox_attempts a
JOIN outbox_attempts b ON b.item_id = a.item_id AND b.lease_token > a.lease_token
WHERE a.outcome IS DISTINCT FROM 'stale_lease' AND a.finished_at > b.started_at`).Scan(&rep.StaleOutcomes)
	if err != nil {
		return fmt.Errorf("chaos: fence check: %w", err)
	}
	err = r.pool.QueryRow(ctx, `
SELECT count(*) FROM (
    SELECT o.id
    FROM outbox_items o
    LEFT JOIN outbox_attempts a ON a.item_id = o.id AND a.outcome = 'accepted'
    WHERE o.state IN ('accepted', 'confirmed')
    GROUP BY o.id, o.lease_token
    HAVING count(a.item_id) <> 1 OR max(a.lease_token) <> o.lease_token
) bad`).Scan(&rep.AcceptanceMismatch)
	if err != nil {
		return fmt.Errorf("chaos: fence check: %w", err)
	}
	if rep.StaleOutcomes > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d items have an outcome written after their lease was taken over (the lease_token fence did not hold)", rep.StaleOutcomes))
	}
	if rep.AcceptanceMismatch > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d accepted items without exactly one accepted attempt under their current lease_token", rep.AcceptanceMismatch))
	}
	return nil
}

// checkStream states invariant 5, one stored message per dispatch: every
// message AURORA_OUTBOX ever stored is one dispatch (generation) of one
// item, stored once — JetStream drops a republish of the same Nats-Msg-Id
// inside its duplicate window. The stream is a work queue (acknowledged
// messages are removed), so the check counts what it stored (its last
// sequence) against the generations there are (the sum of dispatch: a
// generation can go unpublished, never be stored twice). A relay that
// republished without the Msg-Id, after a crash or a lost PubAck, stores
// more. The bound is the generations, not the relays' published_dispatch
// marks: a relay commits its marks with synchronous_commit off, so a
// Postgres crash can lose a mark whose message was stored (harmless: the
// item was delivered, or is published again under the same Msg-Id).
func (r *run) checkStream(ctx context.Context, rep *Report) error {
	if err := r.pool.QueryRow(ctx, `SELECT coalesce(sum(dispatch), 0), coalesce(sum(published_dispatch), 0) FROM outbox_items`).Scan(&rep.Dispatches, &rep.DispatchesPublished); err != nil {
		return fmt.Errorf("chaos: stream check: %w", err)
	}
	s, err := r.js.Stream(ctx, outbox.StreamName)
	if err != nil {
		return fmt.Errorf("chaos: stream check: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("chaos: stream check: %w", err)
	}
	rep.MessagesStored = int64(info.State.LastSeq)
	if rep.MessagesStored > rep.Dispatches {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%s stored %d messages for %d dispatches: a dispatch was published twice (Nats-Msg-Id dedupe did not hold)",
			outbox.StreamName, rep.MessagesStored, rep.Dispatches))
	}
	return nil
}

// Recovery is how long a kind of fault held back work, in seconds, p50 and
// max over that kind's faults:
//
//   - P50/Max: from when the fault hit to the first acceptance of an item
//     staged after it (faults with no later item are left out): how long
//     new usage waited. Under a backlog (the long mode's hot lanes) this is
//     the backlog's latency, whatever the fault;
//   - StallP50/StallMax: from when it hit to the next acceptance of any
//     item: how long the pipeline as a whole stopped (a fault that takes
//     one deliverer away barely shows; Postgres or NATS down shows whole).
type Recovery struct {
	N        int     `json:"n"`
	P50      float64 `json:"p50_seconds"`
	Max      float64 `json:"max_seconds"`
	StallP50 float64 `json:"stall_p50_seconds"`
	StallMax float64 `json:"stall_max_seconds"`
}

// recoveryTimes fills rep.Recovery from the faults and the items.
func (r *run) recoveryTimes(rep *Report, items []item) {
	type acc struct{ created, accepted float64 }
	var acs []acc
	for _, it := range items {
		if it.state == "accepted" || it.state == "confirmed" {
			acs = append(acs, acc{it.created, it.acceptedAt})
		}
	}
	sort.Slice(acs, func(i, j int) bool { return acs[i].created < acs[j].created })
	// suffix minimum of acceptance times: the first acceptance among the
	// items created at or after each position
	first := make([]float64, len(acs)+1)
	first[len(acs)] = -1
	for i := len(acs) - 1; i >= 0; i-- {
		first[i] = acs[i].accepted
		if first[i+1] >= 0 && first[i+1] < first[i] {
			first[i] = first[i+1]
		}
	}
	accepted := make([]float64, len(acs))
	for i, a := range acs {
		accepted[i] = a.accepted
	}
	sort.Float64s(accepted)
	by, stall := map[FaultKind][]float64{}, map[FaultKind][]float64{}
	for _, f := range r.faultList() {
		if f.Skipped {
			continue
		}
		at := float64(f.Start.UnixNano()) / 1e9
		if j := sort.SearchFloat64s(accepted, at); j < len(accepted) {
			stall[f.Kind] = append(stall[f.Kind], accepted[j]-at)
		}
		i := sort.Search(len(acs), func(i int) bool { return acs[i].created >= at })
		if i == len(acs) {
			continue
		}
		by[f.Kind] = append(by[f.Kind], max(first[i]-at, 0))
	}
	rep.Recovery = map[FaultKind]Recovery{}
	for k, xs := range by {
		sort.Float64s(xs)
		rc := Recovery{N: len(xs), P50: quantile(xs, 0.5), Max: xs[len(xs)-1]}
		if ss := stall[k]; len(ss) > 0 {
			sort.Float64s(ss)
			rc.StallP50, rc.StallMax = quantile(ss, 0.5), ss[len(ss)-1]
		}
		rep.Recovery[k] = rc
	}
}
