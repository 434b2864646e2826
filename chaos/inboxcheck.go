package chaos

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"time"
)

// WebhookReport is what the webhook side of a run did and what its
// checker found.
type WebhookReport struct {
	WebhookStats
	// Refused: correctly signed deliveries answered 4xx, by status (a
	// finding: the sender sends only valid events).
	Refused map[int]int `json:"refused,omitempty"`
	// NoRowAfter2xx: deliveries answered 2xx whose row was not there when
	// the harness looked right after the answer.
	NoRowAfter2xx int `json:"no_row_after_2xx"`
	// Never2xx: events sent that never got a 2xx by the check.
	Never2xx int `json:"never_2xx"`
	// NotStored: events answered 2xx without a row at the end; BodyChanged:
	// rows whose stored body differs from what was sent; Unknown: rows of
	// no event sent; IDConflicts: rows of billing_event_id_conflicts.
	NotStored   int `json:"not_stored"`
	BodyChanged int `json:"body_changed"`
	Unknown     int `json:"unknown_rows"`
	IDConflicts int `json:"id_conflicts"`
	// Drained: no row left unprocessed (neither processed nor dead-lettered)
	// within the timeout; DrainSeconds from the start of the check.
	Drained      bool    `json:"drained"`
	DrainSeconds float64 `json:"drain_seconds"`
	// Ambiguities: open ambiguities the model expects (and found equal
	// when ProjectionMismatches is 0).
	Ambiguities int `json:"ambiguities_expected"`
	// ProjectionMismatches: rows of billing_events' state, links,
	// subscriptions, invoices, entitlements and ambiguities that differ
	// from the model; Mismatches lists the first few.
	ProjectionMismatches int      `json:"projection_mismatches"`
	Mismatches           []string `json:"mismatches,omitempty"`
}

// inboxDrainTimeout bounds the wait for the inbox workers: longer than
// one deferral (60 s), so an event deferred once still counts.
const inboxDrainTimeout = 150 * time.Second

// checkInbox states the webhook invariants into rep: (a) no delivery
// answered 2xx without its row, (b) every event answered 2xx stored once,
// verbatim, nothing else stored, (c) once the workers have processed
// everything, the projections equal the model of the events sent
// (expectInbox). It waits for the sender's scripts first.
func (r *run) checkInbox(ctx context.Context, rep *Report) error {
	ib := r.wh
	if ib == nil {
		return nil
	}
	began := time.Now()
	wr := &WebhookReport{}
	rep.Webhooks = wr
	fail := func(format string, args ...any) { rep.Failures = append(rep.Failures, fmt.Sprintf(format, args...)) }
	if !ib.waitScripts(90 * time.Second) {
		fail("webhooks: the sender's scripts still sending 90 s after the heal")
	}
	ib.mu.Lock()
	wr.WebhookStats = ib.stats
	wr.NoRowAfter2xx = len(ib.noRow)
	if len(ib.refused) > 0 {
		wr.Refused = map[int]int{}
		for k, v := range ib.refused {
			wr.Refused[k] = v
		}
	}
	var sent []whEvent
	ok := map[string]bool{}
	for _, id := range ib.order {
		sent = append(sent, *ib.events[id])
		ok[id] = ib.ok[id]
	}
	ib.mu.Unlock()

	// drain: every stored event processed or dead-lettered
	for {
		var open int
		err := r.pool.QueryRow(ctx, `SELECT count(*) FROM billing_events WHERE processed_at IS NULL AND dead_letter_at IS NULL`).Scan(&open)
		if err == nil && open == 0 {
			wr.Drained = true
			break
		}
		if time.Since(began) > inboxDrainTimeout {
			fail("webhooks: %d stored events neither processed nor dead-lettered %s after the heal", open, inboxDrainTimeout)
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	wr.DrainSeconds = time.Since(began).Seconds()

	type stored struct {
		body      []byte
		processed bool
		dead      bool
		reason    string
	}
	rows, err := r.pool.Query(ctx, `SELECT event_id, payload, processed_at IS NOT NULL, dead_letter_at IS NOT NULL, coalesce(last_reason, '') FROM billing_events`)
	if err != nil {
		return err
	}
	got := map[string]stored{}
	for rows.Next() {
		var id string
		var s stored
		if err := rows.Scan(&id, &s.body, &s.processed, &s.dead, &s.reason); err != nil {
			rows.Close()
			return err
		}
		got[id] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM billing_event_id_conflicts`).Scan(&wr.IDConflicts); err != nil {
		return err
	}
	known := map[string]*whEvent{}
	for i := range sent {
		e := &sent[i]
		known[e.ID] = e
		s, there := got[e.ID]
		switch {
		case !ok[e.ID]:
			wr.Never2xx++
		case !there:
			wr.NotStored++
		case !bytes.Equal(s.body, e.body):
			wr.BodyChanged++
		}
	}
	for id := range got {
		if known[id] == nil {
			wr.Unknown++
		}
	}
	if wr.NoRowAfter2xx > 0 {
		fail("webhooks: %d deliveries answered 2xx without their row in billing_events right after", wr.NoRowAfter2xx)
	}
	if wr.NotStored > 0 || wr.BodyChanged > 0 || wr.Unknown > 0 || wr.IDConflicts > 0 {
		fail("webhooks: of the events answered 2xx %d not stored, %d stored with another body; %d rows of no event sent, %d id conflicts", wr.NotStored, wr.BodyChanged, wr.Unknown, wr.IDConflicts)
	}
	if wr.Never2xx > 0 {
		fail("webhooks: %d events never answered 2xx", wr.Never2xx)
	}
	for status, n := range wr.Refused {
		fail("webhooks: %d correctly signed deliveries answered %d", n, status)
	}

	// (c) the projections against the model
	m := expectInbox(sent, webhookPlans)
	wr.Ambiguities = len(m.Ambiguities)
	var mism []string
	bad := func(format string, args ...any) { mism = append(mism, fmt.Sprintf(format, args...)) }
	for _, e := range sent {
		s, there := got[e.ID]
		if !there {
			continue // counted above
		}
		want, dead := m.DeadLetters[e.ID]
		switch {
		case dead && (!s.dead || s.reason != want):
			bad("event %s: want dead letter %s, got processed=%t dead=%t reason=%q", e.ID, want, s.processed, s.dead, s.reason)
		case !dead && !s.processed:
			bad("event %s: want processed, got dead=%t reason=%q", e.ID, s.dead, s.reason)
		}
	}
	if err := r.compareProjections(ctx, m, bad); err != nil {
		return err
	}
	sort.Strings(mism)
	wr.ProjectionMismatches = len(mism)
	if len(mism) > 0 {
		wr.Mismatches = mism[:min(len(mism), 12)]
		fail("webhooks: %d projection rows differ from the model of the events sent, e.g. %v", len(mism), mism[:min(len(mism), 3)])
	}
	return nil
}

// compareProjections reads the harness's customers' rows (ids
// cus_chaoswh…, tenants wh-tenant-…) and calls bad for each difference
// from m.
func (r *run) compareProjections(ctx context.Context, m inboxModel, bad func(string, ...any)) error {
	// links
	rows, err := r.pool.Query(ctx, `SELECT customer_id, tenant, coalesce(invoice_status, ''),
		coalesce(extract(epoch FROM invoice_status_event_created)::bigint, 0) FROM stripe_customer_links WHERE customer_id LIKE 'cus_chaoswh%'`)
	if err != nil {
		return err
	}
	links := map[string]modelLink{}
	for rows.Next() {
		var c string
		var l modelLink
		if err := rows.Scan(&c, &l.Tenant, &l.Status, &l.StatusCreated); err != nil {
			rows.Close()
			return err
		}
		links[c] = l
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	compareMaps("customer link", m.Links, links, bad)

	rows, err = r.pool.Query(ctx, `SELECT subscription_id, customer_id, tenant, status, coalesce(price_id, ''), coalesce(plan, ''),
		coalesce(extract(epoch FROM current_period_end)::bigint, 0), cancel_at_period_end, extract(epoch FROM last_event_created)::bigint, last_event_id
		FROM stripe_subscriptions WHERE customer_id LIKE 'cus_chaoswh%'`)
	if err != nil {
		return err
	}
	subs := map[string]modelSub{}
	for rows.Next() {
		var id string
		var s modelSub
		if err := rows.Scan(&id, &s.Customer, &s.Tenant, &s.Status, &s.Price, &s.Plan, &s.PeriodEnd, &s.Cancel, &s.Created, &s.EventID); err != nil {
			rows.Close()
			return err
		}
		if w, ok := m.Subs[id]; ok && w.EventID == "" {
			s.EventID = "" // two events of one snapshot in that second: either may be kept
		}
		subs[id] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	compareMaps("subscription", m.Subs, subs, bad)

	rows, err = r.pool.Query(ctx, `SELECT invoice_id, customer_id, tenant, subscription_id, outcome, extract(epoch FROM last_event_created)::bigint, last_event_id
		FROM stripe_invoices WHERE customer_id LIKE 'cus_chaoswh%'`)
	if err != nil {
		return err
	}
	invs := map[string]modelInvoice{}
	for rows.Next() {
		var id string
		var v modelInvoice
		if err := rows.Scan(&id, &v.Customer, &v.Tenant, &v.Sub, &v.Outcome, &v.Created, &v.EventID); err != nil {
			rows.Close()
			return err
		}
		if w, ok := m.Invoices[id]; ok && w.EventID == "" {
			v.EventID = ""
		}
		invs[id] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	compareMaps("invoice", m.Invoices, invs, bad)

	rows, err = r.pool.Query(ctx, `SELECT tenant, customer_id, coalesce(subscription_id, ''), coalesce(subscription_status, ''), coalesce(plan, ''),
		billing_status, coalesce(extract(epoch FROM grace_until)::bigint, 0) FROM tenant_entitlements WHERE tenant LIKE 'wh-tenant-%'`)
	if err != nil {
		return err
	}
	ents := map[string]modelEnt{}
	for rows.Next() {
		var t string
		var e modelEnt
		if err := rows.Scan(&t, &e.Customer, &e.SubID, &e.SubStatus, &e.Plan, &e.Billing, &e.GraceUntil); err != nil {
			rows.Close()
			return err
		}
		ents[t] = e
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	compareMaps("entitlement", m.Ents, ents, bad)

	rows, err = r.pool.Query(ctx, `SELECT kind, subject_id, extract(epoch FROM event_second)::bigint FROM billing_ambiguities
		WHERE status = 'open' AND customer_id LIKE 'cus_chaoswh%'`)
	if err != nil {
		return err
	}
	ambs := map[modelAmb]bool{}
	for rows.Next() {
		var a modelAmb
		if err := rows.Scan(&a.Kind, &a.Subject, &a.Second); err != nil {
			rows.Close()
			return err
		}
		ambs[a] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	compareMaps("open ambiguity", m.Ambiguities, ambs, bad)
	return nil
}

// compareMaps calls bad for every key of want or got whose values differ
// (or that only one has).
func compareMaps[K comparable, V comparable](what string, want, got map[K]V, bad func(string, ...any)) {
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			bad("%s %v: want %+v, got no row", what, k, w)
		case g != w:
			bad("%s %v: want %+v, got %+v", what, k, w, g)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			bad("%s %v: want no row, got %+v", what, k, g)
		}
	}
}
