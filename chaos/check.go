package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"time"
)

// Report is what a run measured and what the checker found.
type Report struct {
	Seed          uint64            `json:"seed"`
	Command       string            `json:"command"`
	NATSNodes     int               `json:"nats_nodes"`
	Items         int               `json:"items"`          // staged by the producer
	Staged        int               `json:"staged_rows"`    // outbox rows found
	ByState       map[string]int    `json:"by_state"`       // rows per state
	Faults        map[FaultKind]int `json:"faults"`         // injected, by kind
	FaultsSkipped int               `json:"faults_skipped"` // no target was running
	// FaultsAfterStaging: injected faults that came after the producer had
	// staged everything (the schedule runs late when faults wait for their
	// targets); the items were still being delivered.
	FaultsAfterStaging int     `json:"faults_after_staging"`
	Corrections        int     `json:"corrections"`      // staged items that are corrections (half negative: cancel and restate)
	Lost               int     `json:"lost"`             // staged, not accepted/confirmed, not applied
	AppliedTwice       int     `json:"applied_twice"`    // identifiers applied more than once
	Mismatched         int     `json:"mismatched"`       // applied value ≠ the item's quantity, or applied without an accepted item
	Committed          int64   `json:"committed"`        // quantity of accepted/confirmed items
	Applied            float64 `json:"applied"`          // quantity the emulator applied
	Overlaps429        int     `json:"overlaps_429"`     // 429 "one concurrent call per customer and meter" answers
	RateLimited429     int     `json:"rate_limited_429"` // other 429s
	Reclaimed          int     `json:"reclaimed"`        // items claimed more than once (attempts > 1)
	// StaleLeases: leases that ended without an outcome, written
	// stale_lease by the claim that took the row over: the items a killed
	// or stopped owner held, which waited for their lease to expire.
	StaleLeases int `json:"stale_leases"`
	// StaleLeaseWaitP50, StaleLeaseWaitMax: how long those items waited,
	// from the dead holder's lease to the take-over, in seconds.
	StaleLeaseWaitP50 float64 `json:"stale_lease_wait_p50_seconds"`
	StaleLeaseWaitMax float64 `json:"stale_lease_wait_max_seconds"`
	// Attempts: every attempt row by outcome (retries, 429s, stale leases).
	Attempts map[string]int `json:"attempts"`
	// OwnerKills: kill_owner faults that hit hot partitions, with how long
	// the hot lanes they owned waited for their next acceptance.
	OwnerKills []LaneWait `json:"owner_kills"`
	// NewLeader: for each kill of AURORA_OUTBOX's leader, seconds until
	// another node led it (-1: none within 30 s).
	NewLeader   []float64 `json:"new_leader_seconds,omitempty"`
	LaneWaitP50 float64   `json:"lane_wait_p50_seconds"`
	LaneWaitMax float64   `json:"lane_wait_max_seconds"`
	AcceptP50   float64   `json:"stage_to_accepted_p50_seconds"`
	AcceptP99   float64   `json:"stage_to_accepted_p99_seconds"`
	AcceptMax   float64   `json:"stage_to_accepted_max_seconds"`
	// Exits: processes that exited without the harness killing them
	// (restarted a second later, as an orchestrator would), by name.
	Exits map[string]int `json:"exits_on_their_own"`
	// StaleOutcomes: items with an outcome written after a later lease
	// was claimed (invariant 4; must be 0).
	StaleOutcomes int `json:"stale_outcomes"`
	// AcceptanceMismatch: accepted items without exactly one accepted
	// attempt under their current lease_token (invariant 4; must be 0).
	AcceptanceMismatch int `json:"acceptance_mismatch"`
	// MessagesStored: messages AURORA_OUTBOX ever stored (its last
	// sequence); Dispatches: Σ dispatch, the generations there are
	// (invariant 5: stored ≤ generations); DispatchesPublished: Σ
	// published_dispatch, the relays' marks (reported only).
	MessagesStored      int64 `json:"messages_stored"`
	Dispatches          int64 `json:"dispatches"`
	DispatchesPublished int64 `json:"dispatches_published"`
	// Recovery by fault kind: from the fault to the first acceptance of
	// an item staged after it.
	Recovery map[FaultKind]Recovery `json:"recovery"`
	// Webhooks: the webhook sender and the inbox checker (inboxcheck.go).
	Webhooks       *WebhookReport `json:"webhooks,omitempty"`
	Drained        bool           `json:"drained"`
	DrainSeconds   float64        `json:"drain_seconds"` // from the end of the load to nothing pending or leased
	ElapsedSeconds float64        `json:"elapsed_seconds"`
	Failures       []string       `json:"failures"`
	// Events: domain events and the reconciler (eventscheck.go).
	Events *EventsReport `json:"events,omitempty"`
	Dir    string        `json:"dir,omitempty"` // kept work directory (logs)
}

// LaneWait is one kill of a hot-lane owner: the hot lanes it owned and
// how long each waited from the kill to its next accepted item.
type LaneWait struct {
	Target string    `json:"target"`
	At     time.Time `json:"at"`
	Lanes  int       `json:"lanes"`
	// Waits in seconds, one per lane (the lane's next acceptance after the
	// kill); a lane with nothing accepted afterwards is left out.
	Waits []float64 `json:"waits_seconds"`
}

type item struct {
	key        string
	tenant     string
	quantity   int64
	corrects   string // a correction's: the key of the item it corrects
	state      string
	attempts   int
	created    float64 // Unix seconds
	acceptedAt float64 // Unix seconds: its accepted attempt's end (updated_at when none)
}

type appliedEvent struct {
	Identifier string  `json:"identifier"`
	Value      float64 `json:"value"`
	Cancelled  bool    `json:"cancelled"`
}

type emuStats struct {
	Outcomes              map[string]int `json:"outcomes"`
	DuplicateApplications int            `json:"duplicate_applications"`
	Overlaps              int            `json:"overlaps"`
}

func getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("chaos: GET %s: status %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// check states the invariants over the database and the emulator.
func (r *run) check(ctx context.Context, prod *producer) (*Report, error) {
	rep := &Report{Seed: r.o.Seed, Command: r.o.Command, NATSNodes: r.o.NATSNodes, Items: prod.staged(), ByState: map[string]int{}, Faults: map[FaultKind]int{}}
	r.mu.Lock()
	stagedAt := r.stagedAt
	r.mu.Unlock()
	for _, f := range r.faultList() {
		if f.Skipped {
			rep.FaultsSkipped++
		} else {
			rep.Faults[f.Kind]++
			if !stagedAt.IsZero() && f.Start.After(stagedAt) {
				rep.FaultsAfterStaging++
			}
		}
		if !f.Skipped && f.Kind == FaultKillStreamLeader {
			rep.NewLeader = append(rep.NewLeader, f.NewLeaderSeconds)
		}
	}
	rows, err := r.pool.Query(ctx, `SELECT o.idempotency_key, o.tenant, o.quantity, o.state::text, o.attempts,
		extract(epoch FROM o.created_at)::float8,
		-- when it was accepted: its accepted attempt's end (updated_at moves again at confirmation)
		extract(epoch FROM coalesce((SELECT max(a.finished_at) FROM outbox_attempts a WHERE a.item_id = o.id AND a.outcome = 'accepted'), o.updated_at))::float8,
		coalesce(t.idempotency_key, '')
		FROM outbox_items o
		LEFT JOIN usage_events c ON c.item_id = o.id AND c.kind = 'correction'
		LEFT JOIN usage_events x ON x.tenant = c.tenant AND x.event_id = c.corrects_event_id
		LEFT JOIN outbox_items t ON t.id = x.item_id`)
	if err != nil {
		return nil, err
	}
	var items []item
	for rows.Next() {
		var it item
		if err := rows.Scan(&it.key, &it.tenant, &it.quantity, &it.state, &it.attempts, &it.created, &it.acceptedAt, &it.corrects); err != nil {
			rows.Close()
			return nil, err
		}
		items = append(items, it)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rep.Attempts = map[string]int{}
	arows, err := r.pool.Query(ctx, `SELECT outcome::text, extract(epoch FROM finished_at - started_at)::float8 FROM outbox_attempts`)
	if err != nil {
		return nil, err
	}
	var stale []float64
	for arows.Next() {
		var outcome string
		var took float64
		if err := arows.Scan(&outcome, &took); err != nil {
			arows.Close()
			return nil, err
		}
		rep.Attempts[outcome]++
		if outcome == "stale_lease" {
			stale = append(stale, took)
		}
	}
	arows.Close()
	if err := arows.Err(); err != nil {
		return nil, err
	}
	sort.Float64s(stale)
	rep.StaleLeases, rep.StaleLeaseWaitP50 = len(stale), quantile(stale, 0.5)
	if len(stale) > 0 {
		rep.StaleLeaseWaitMax = stale[len(stale)-1]
	}
	var applied struct {
		Data []appliedEvent `json:"data"`
	}
	if err := getJSON(ctx, r.emuURL+"/_emulator/applied", &applied); err != nil {
		return nil, err
	}
	var st emuStats
	if err := getJSON(ctx, r.emuURL+"/_emulator/stats", &st); err != nil {
		return nil, err
	}

	times := map[string]int{} // live (not cancelled) applications per identifier
	value := map[string]float64{}
	cancels := map[string]int{} // cancelled applications per identifier
	cancelled := map[string]float64{}
	for _, a := range applied.Data {
		if a.Cancelled {
			cancels[a.Identifier]++
			cancelled[a.Identifier] += a.Value
			continue
		}
		times[a.Identifier]++
		value[a.Identifier] += a.Value
		rep.Applied += a.Value
	}
	for _, n := range times {
		if n > 1 {
			rep.AppliedTwice++
		}
	}
	rep.AppliedTwice = max(rep.AppliedTwice, st.DuplicateApplications)
	rep.Overlaps429 = st.Overlaps
	rep.RateLimited429 = st.Outcomes["rate_limited"]

	rep.Staged = len(items)
	known := map[string]bool{}
	want := expectations(items)
	var lat []float64
	for _, it := range items {
		rep.ByState[it.state]++
		known[it.key] = true
		if it.attempts > 1 {
			rep.Reclaimed++
		}
		if it.corrects != "" {
			rep.Corrections++
		}
		w := want[it.key]
		switch it.state {
		case "accepted", "confirmed":
			rep.Committed += it.quantity
			lat = append(lat, it.acceptedAt-it.created)
			switch {
			case times[it.key] == 0 && cancels[it.key] == 0 && (w.live > 0 || w.cancelled):
				rep.Lost++
			case w.cancelled && (times[it.key] != 0 || cancels[it.key] != 1 || cancelled[it.key] != float64(it.quantity)):
				rep.Mismatched++ // cancelled by an accepted negative correction: one cancelled application of its value
			case !w.cancelled && w.live > 0 && (times[it.key] != 1 || value[it.key] != float64(w.live) || cancels[it.key] != 0):
				rep.Mismatched++
			case !w.cancelled && w.live <= 0 && (times[it.key] != 0 || cancels[it.key] != 0):
				rep.Mismatched++ // a correction that restates nothing sends nothing
			}
		default:
			if times[it.key] == 0 && cancels[it.key] == 0 {
				rep.Lost++
			} else {
				rep.Mismatched++ // applied at Stripe, not accepted here
			}
		}
	}
	for id := range times {
		if !known[id] {
			rep.Mismatched++
		}
	}
	for id := range cancels {
		if !known[id] {
			rep.Mismatched++
		}
	}
	sort.Float64s(lat)
	rep.AcceptP50, rep.AcceptP99 = quantile(lat, 0.5), quantile(lat, 0.99)
	if len(lat) > 0 {
		rep.AcceptMax = lat[len(lat)-1]
	}
	r.laneWaits(rep, items)
	r.recoveryTimes(rep, items)
	if err := r.checkFence(ctx, rep); err != nil {
		return nil, err
	}
	if err := r.checkStream(ctx, rep); err != nil {
		return nil, err
	}

	if rep.Staged != rep.Items {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d items staged, %d outbox rows", rep.Items, rep.Staged))
	}
	if n := rep.ByState["accepted"] + rep.ByState["confirmed"]; n != rep.Staged {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d of %d items accepted or confirmed (by state: %v)", n, rep.Staged, rep.ByState))
	}
	if rep.Lost > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d items lost (never applied at the emulator)", rep.Lost))
	}
	if rep.AppliedTwice > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d identifiers applied more than once", rep.AppliedTwice))
	}
	if rep.Mismatched > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d items whose application does not match the row (value, count or state)", rep.Mismatched))
	}
	if float64(rep.Committed) != rep.Applied || prod.committed != rep.Committed {
		rep.Failures = append(rep.Failures, fmt.Sprintf("quantity: staged %d, committed (accepted) %d, applied %.0f", prod.committed, rep.Committed, rep.Applied))
	}
	if err := r.checkInbox(ctx, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// expectation is what the emulator must hold for one accepted item.
type expectation struct {
	live      int64 // the value of its live application (none when ≤ 0)
	cancelled bool  // its application was cancelled by a negative correction
}

// expectations applies the correction rules to the staged items: an event
// or a positive correction carries its quantity at Stripe; a negative
// correction of record X cancels X's application and restates v(X) + its
// (negative) quantity under its own identifier, sending nothing when that
// is not above zero. Only accepted (or confirmed) negative corrections have
// cancelled anything.
func expectations(items []item) map[string]expectation {
	byKey := make(map[string]item, len(items))
	for _, it := range items {
		byKey[it.key] = it
	}
	var v func(key string, depth int) int64
	v = func(key string, depth int) int64 {
		it := byKey[key]
		if it.corrects == "" || it.quantity >= 0 || depth > len(items) {
			return it.quantity
		}
		return v(it.corrects, depth+1) + it.quantity
	}
	out := make(map[string]expectation, len(items))
	for _, it := range items {
		e := out[it.key]
		e.live = v(it.key, 0)
		out[it.key] = e
		if it.corrects != "" && it.quantity < 0 && (it.state == "accepted" || it.state == "confirmed") {
			t := out[it.corrects]
			t.cancelled = true
			out[it.corrects] = t
		}
	}
	return out
}

// laneWaits measures, for each kill of a deliverer owning hot partitions,
// how long each of its hot lanes waited from the kill to its next
// accepted item (updated_at of an accepted row is when it was accepted).
func (r *run) laneWaits(rep *Report, items []item) {
	accepted := map[string][]float64{} // tenant → acceptance times, sorted
	for _, it := range items {
		if it.state == "accepted" || it.state == "confirmed" {
			accepted[it.tenant] = append(accepted[it.tenant], it.acceptedAt)
		}
	}
	for _, ts := range accepted {
		sort.Float64s(ts)
	}
	var all []float64
	for _, f := range r.faultList() {
		if f.Skipped || (f.Kind != FaultKillOwner && f.Kind != FaultKillDeliverer) || len(f.Hot) == 0 {
			continue
		}
		hot := map[int]bool{}
		for _, p := range f.Hot {
			hot[p] = true
		}
		at := float64(f.Start.UnixNano()) / 1e9
		lw := LaneWait{Target: f.Target, At: f.Start, Waits: []float64{}}
		for _, t := range r.hot {
			if !hot[r.partitions[t]] {
				continue
			}
			lw.Lanes++
			ts := accepted[t]
			i := sort.SearchFloat64s(ts, at)
			if i < len(ts) {
				lw.Waits = append(lw.Waits, ts[i]-at)
				all = append(all, ts[i]-at)
			}
		}
		rep.OwnerKills = append(rep.OwnerKills, lw)
	}
	sort.Float64s(all)
	rep.LaneWaitP50 = quantile(all, 0.5)
	if len(all) > 0 {
		rep.LaneWaitMax = all[len(all)-1]
	}
}

// quantile returns the q-quantile of sorted xs (nearest rank), 0 when empty.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
