package chaos

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// webhookSecret is the endpoint signing secret both inboxes verify with.
const webhookSecret = "whsec_auroraChaos0harness"

// webhookPlans is the price → plan table the harness provisions.
var webhookPlans = map[string]string{"price_chaos_basic": "basic", "price_chaos_pro": "pro", "price_chaos_team": "team"}

// Inboxes: the inbox processes the harness runs (each the webhook
// endpoint and a worker on the one database).
const Inboxes = 2

// inboxes are the webhook side of a run: the inbox processes and the
// sender that plays Stripe's webhook deliveries to them.
type inboxes struct {
	procs []*proc
	addrs []string // host:port of each inbox

	mu      sync.Mutex
	events  map[string]*whEvent // every event sent at least once, by id
	order   []string            // ids in first-send order
	ok      map[string]bool     // answered 2xx at least once
	stats   WebhookStats
	noRow   []string // 2xx without a row right after the answer
	refused map[int]int
	scripts sync.WaitGroup
	// stop ends every delivery still retrying (teardown).
	stop context.CancelFunc
	ctx  context.Context
}

// WebhookStats is what the sender did.
type WebhookStats struct {
	Customers    int `json:"customers"`      // scripts started (one customer, tenant and subscription each)
	Events       int `json:"events"`         // distinct event ids sent
	Requests     int `json:"requests"`       // POSTs, resends and redeliveries included
	Answered2xx  int `json:"answered_2xx"`   // POSTs answered 2xx
	Failed       int `json:"failed"`         // POSTs that got no answer (connection refused, killed mid-request) or a 5xx: retried with the same id
	Redeliveries int `json:"redeliveries"`   // the same event id sent again after a 2xx
	Concurrent   int `json:"concurrent"`     // redeliveries sent to both inboxes at once
	SameSecond   int `json:"same_second"`    // same-second conflicting pairs sent
	Abandoned    int `json:"abandoned"`      // scripts stopped because an earlier phase was not processed in time
	Unverified2x int `json:"unverified_2xx"` // 2xx whose row could not be read right after (the harness's query failed)
}

// startInboxes starts the inbox processes and provisions the price → plan
// table their projections map prices with.
func (r *run) startInboxes(ctx context.Context) error {
	ib := &inboxes{events: map[string]*whEvent{}, ok: map[string]bool{}, refused: map[int]int{}}
	ib.ctx, ib.stop = context.WithCancel(context.Background())
	r.wh = ib
	for price, plan := range webhookPlans {
		if _, err := r.pool.Exec(ctx, `INSERT INTO stripe_price_plans (price_id, plan) VALUES ($1, $2) ON CONFLICT DO NOTHING`, price, plan); err != nil {
			return err
		}
	}
	for i := range Inboxes {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p := &proc{name: fmt.Sprintf("inbox-%d", i), supervise: true, bin: r.o.Bin.Aurora, dir: r.dir, args: []string{"inbox"}, env: env(
			"AURORA_DATABASE_URL="+r.dbURL, "AURORA_STRIPE_WEBHOOK_SECRET="+webhookSecret, "AURORA_INBOX_ADDR="+addr,
			"AURORA_INBOX_POLL_MS=1000", "AURORA_INBOX_BATCH_SIZE=25")}
		if err := p.start(); err != nil {
			return err
		}
		ib.procs = append(ib.procs, p)
		ib.addrs = append(ib.addrs, addr)
	}
	for _, addr := range ib.addrs {
		if err := waitHTTP(ctx, "http://"+addr+"/readyz", 60*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// inboxProcs returns the inbox processes (none before startInboxes).
func (r *run) inboxProcs() []*proc {
	if r.wh == nil {
		return nil
	}
	return r.wh.procs
}

// inboxReadyz returns the inboxes' listen addresses.
func (r *run) inboxAddrs() []string {
	if r.wh == nil {
		return nil
	}
	return r.wh.addrs
}

// sign returns the Stripe-Signature header of body at t: t=<unix>,
// v1=<hex HMAC-SHA256 of "<unix>.<body>" under the secret>.
func sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// encode fixes e's body: a Stripe event envelope around its object.
func (e *whEvent) encode() {
	var obj map[string]any
	switch {
	case e.Type == whCheckout:
		obj = map[string]any{"id": "cs_" + e.ID, "object": "checkout.session", "customer": e.Customer,
			"client_reference_id": e.Tenant, "mode": "subscription", "subscription": e.Sub}
	case e.isSub():
		obj = map[string]any{"id": e.Sub, "object": "subscription", "customer": e.Customer, "status": e.Status,
			"current_period_end": e.PeriodEnd, "cancel_at_period_end": e.Cancel,
			"items": map[string]any{"object": "list", "data": []any{map[string]any{"price": map[string]any{"id": e.Price}}}}}
	case e.isInvoice():
		obj = map[string]any{"id": e.Invoice, "object": "invoice", "customer": e.Customer, "subscription": e.Sub, "currency": "usd"}
		if e.outcome() == "paid" {
			obj["amount_paid"] = 4900
		} else {
			obj["amount_due"] = 4900
		}
	default:
		obj = map[string]any{"id": e.Customer, "object": "customer", "email": nil}
	}
	body, err := json.Marshal(map[string]any{"id": e.ID, "object": "event", "type": e.Type, "api_version": "2024-06-20",
		"created": e.Created, "livemode": false, "data": map[string]any{"object": obj}})
	if err != nil {
		panic(err) // plain values only
	}
	e.body = body
}

// script returns customer i's events in phases: A (the checkout, a
// customer.updated and 2–4 subscription snapshots at distinct seconds),
// B (1–4 invoice outcomes over 1–2 invoices at distinct seconds), C
// (for some customers, a same-second conflicting pair of subscription
// snapshots after the latest one, and/or of invoice outcomes after the
// latest one). base is the script's first Stripe second.
func script(seed uint64, i int, base int64) [3][]*whEvent {
	rng := rand.New(rand.NewPCG(seed, 0x776830+uint64(i))) // "wh0"+i
	cus, tenant, sub := fmt.Sprintf("cus_chaoswh%03d", i), fmt.Sprintf("wh-tenant-%03d", i), fmt.Sprintf("sub_chaoswh%03d", i)
	n := 0
	ev := func(typ string, created int64) *whEvent {
		n++
		return &whEvent{ID: fmt.Sprintf("evt_chaoswh%03d_%02d", i, n), Type: typ, Created: created, Customer: cus, Sub: sub}
	}
	statuses := []string{"trialing", "active", "active", "past_due", "unpaid", "canceled"}
	prices := []string{"price_chaos_basic", "price_chaos_pro", "price_chaos_team"}
	snap := func(e *whEvent) *whEvent {
		e.Status = statuses[rng.IntN(len(statuses))]
		e.Price = prices[rng.IntN(len(prices))]
		e.PeriodEnd = e.Created + 30*24*3600
		e.Cancel = rng.IntN(4) == 0
		return e
	}
	var ph [3][]*whEvent
	co := ev(whCheckout, base)
	co.Tenant = tenant
	ph[0] = append(ph[0], co, ev(whCustomerUpdated, base+int64(rng.IntN(5))))
	t := base
	for k, subs := 0, 2+rng.IntN(3); k < subs; k++ {
		t += 1 + int64(rng.IntN(3))
		typ := whSubUpdated
		if k == 0 {
			typ = whSubCreated
		}
		ph[0] = append(ph[0], snap(ev(typ, t)))
	}
	lastSub := t
	invs := []string{fmt.Sprintf("in_chaoswh%03d_a", i), fmt.Sprintf("in_chaoswh%03d_b", i)}
	types := []string{whInvoicePaid, whInvoiceSucceded, whInvoiceFailed, whInvoiceFailed}
	t = base + 1
	for k, m := 0, 1+rng.IntN(4); k < m; k++ {
		t += 1 + int64(rng.IntN(3))
		e := ev(types[rng.IntN(len(types))], t)
		e.Invoice = invs[rng.IntN(1+rng.IntN(2))]
		ph[1] = append(ph[1], e)
	}
	lastInv := t
	if rng.IntN(3) == 0 { // a subscription pair: two different snapshots in one second
		at := lastSub + 1 + int64(rng.IntN(2))
		a, b := snap(ev(whSubUpdated, at)), snap(ev(whSubUpdated, at))
		if a.snapshot() == b.snapshot() {
			b.Status = map[bool]string{true: "active", false: "canceled"}[a.Status == "canceled"]
		}
		ph[2] = append(ph[2], a, b)
	}
	if rng.IntN(3) == 0 { // an invoice pair: opposite outcomes in one second
		at := lastInv + 1 + int64(rng.IntN(2))
		a, b := ev(whInvoicePaid, at), ev(whInvoiceFailed, at)
		a.Invoice, b.Invoice = invs[0], invs[rng.IntN(2)] // one invoice, or two of the customer's
		ph[2] = append(ph[2], a, b)
	}
	for p := range ph {
		for _, e := range ph[p] {
			e.encode()
		}
	}
	return ph
}

// send plays Stripe's webhook sender until load ends: customers scripts
// started over the first two thirds of the load, each run phase by phase
// (a phase is sent once the previous one is processed: a same-second pair
// must find everything earlier of its object applied, the one order the
// documented rules decide without an operator). Within a phase the events
// go out shuffled, overlapping, to either inbox at random; a 2xx'd event
// is redelivered now and then (sometimes to both inboxes at once); a
// request without a 2xx is retried with the same event id until it gets
// one, after load too (until ctx ends).
func (r *run) sendWebhooks(load context.Context, customers int) {
	ib := r.wh
	ctx := ib.ctx
	span := r.o.StageFor * 2 / 3
	start := time.Now()
	base := start.Add(-time.Hour).Unix()
	for i := range customers {
		at := time.Duration(int64(span) * int64(i) / int64(max(customers, 1)))
		select {
		case <-load.Done():
			return
		case <-time.After(time.Until(start.Add(at))):
		}
		ib.mu.Lock()
		ib.stats.Customers++
		ib.mu.Unlock()
		ib.scripts.Add(1)
		go func() {
			defer ib.scripts.Done()
			r.runScript(ctx, load, i, script(r.o.Seed, i, base+int64(i)*100))
		}()
	}
}

// runScript sends one customer's phases.
func (r *run) runScript(ctx, load context.Context, i int, ph [3][]*whEvent) {
	ib := r.wh
	rng := rand.New(rand.NewPCG(r.o.Seed, 0x736e64+uint64(i))) // "snd"+i
	for p, evs := range ph {
		if len(evs) == 0 {
			continue
		}
		if load.Err() != nil {
			return // no new phase after the load
		}
		var wg sync.WaitGroup
		if p == 2 {
			// the pairs: both of a pair at once, to either inbox
			for k := 0; k+1 < len(evs); k += 2 {
				ib.mu.Lock()
				ib.stats.SameSecond++
				ib.mu.Unlock()
				for _, e := range evs[k : k+2] {
					wg.Add(1)
					pick := rng.IntN(len(ib.addrs))
					go func() { defer wg.Done(); r.deliver(ctx, e, pick, rand.New(rand.NewPCG(rng.Uint64(), 1))) }()
				}
			}
		} else {
			order := rng.Perm(len(evs))
			for _, k := range order {
				e := evs[k]
				wg.Add(1)
				pick := rng.IntN(len(ib.addrs))
				sub := rand.New(rand.NewPCG(rng.Uint64(), 2))
				go func() { defer wg.Done(); r.deliver(ctx, e, pick, sub) }()
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
			}
		}
		wg.Wait()
		if p == len(ph)-1 {
			return
		}
		// wait until the phase is processed before the next one
		ids := make([]string, len(evs))
		for k, e := range evs {
			ids[k] = e.ID
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			var done int
			err := r.pool.QueryRow(ctx, `SELECT count(*) FROM billing_events WHERE event_id = ANY($1) AND processed_at IS NOT NULL`, ids).Scan(&done)
			if err == nil && done == len(ids) {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				ib.mu.Lock()
				ib.stats.Abandoned++
				ib.mu.Unlock()
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// deliver sends e to inbox pick until it answers 2xx (the next attempt
// 0.3–1.5 s later, to either inbox, like Stripe retrying), then maybe
// redelivers it: once in three to a random inbox, a third of those to both
// inboxes at once.
func (r *run) deliver(ctx context.Context, e *whEvent, pick int, rng *rand.Rand) {
	ib := r.wh
	ib.mu.Lock()
	if _, ok := ib.events[e.ID]; !ok {
		ib.events[e.ID] = e
		ib.order = append(ib.order, e.ID)
		ib.stats.Events++
	}
	ib.mu.Unlock()
	r.untilAnswered(ctx, e, pick, rng)
	if rng.IntN(3) != 0 {
		return
	}
	time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
	if rng.IntN(3) == 0 {
		ib.mu.Lock()
		ib.stats.Redeliveries += 2
		ib.stats.Concurrent++
		ib.mu.Unlock()
		var wg sync.WaitGroup
		for k := range ib.addrs {
			wg.Add(1)
			sub := rand.New(rand.NewPCG(rng.Uint64(), 3))
			go func() { defer wg.Done(); r.untilAnswered(ctx, e, k, sub) }()
		}
		wg.Wait()
		return
	}
	ib.mu.Lock()
	ib.stats.Redeliveries++
	ib.mu.Unlock()
	r.untilAnswered(ctx, e, rng.IntN(len(ib.addrs)), rng)
}

// untilAnswered posts e until a 2xx, or ctx ends.
func (r *run) untilAnswered(ctx context.Context, e *whEvent, pick int, rng *rand.Rand) {
	ib := r.wh
	for ctx.Err() == nil {
		status, err := r.post(ctx, ib.addrs[pick], e)
		ib.mu.Lock()
		ib.stats.Requests++
		switch {
		case err == nil && status/100 == 2:
			ib.stats.Answered2xx++
			ib.ok[e.ID] = true
		case err == nil && status/100 == 4:
			ib.refused[status]++
		default:
			ib.stats.Failed++
		}
		ib.mu.Unlock()
		if err == nil && status/100 == 2 {
			r.verifyRow(ctx, e)
			return
		}
		if err == nil && status/100 == 4 {
			return // refused a correctly signed event: reported by the checker, never retried
		}
		select {
		case <-ctx.Done():
		case <-time.After(300*time.Millisecond + time.Duration(rng.IntN(1200))*time.Millisecond):
		}
		pick = rng.IntN(len(ib.addrs))
	}
}

// post sends one signed delivery of e and returns the status.
func (r *run) post(ctx context.Context, addr string, e *whEvent) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/webhooks/stripe", bytes.NewReader(e.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", sign(webhookSecret, time.Now(), e.body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// verifyRow checks, right after a 2xx, that e's row is committed (a 2xx
// promises it); a failed query is counted unverified (the end check still
// covers the row).
func (r *run) verifyRow(ctx context.Context, e *whEvent) {
	var n int
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := r.pool.QueryRow(qctx, `SELECT count(*) FROM billing_events WHERE event_id = $1`, e.ID).Scan(&n)
	ib := r.wh
	ib.mu.Lock()
	defer ib.mu.Unlock()
	switch {
	case err != nil:
		ib.stats.Unverified2x++
	case n == 0:
		ib.noRow = append(ib.noRow, e.ID)
	}
}

// waitScripts waits for the started scripts to end (their last phase
// answered) for at most d.
func (ib *inboxes) waitScripts(d time.Duration) bool {
	done := make(chan struct{})
	go func() { ib.scripts.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// pickInbox returns a running inbox chosen by pick in [0, 1), nil when
// none runs.
func (r *run) pickInbox(pick float64) *proc {
	var up []*proc
	for _, p := range r.inboxProcs() {
		if p.current() == procRunning {
			up = append(up, p)
		}
	}
	if len(up) == 0 {
		return nil
	}
	return up[int(pick*float64(len(up)))]
}

// webhookAnnounced is the SQL condition on event_outbox naming the domain
// events the inbox announced for the sender's customers (aggregates: their
// subscriptions, tenants and invoices). The domain-event checker leaves
// them out: it judges the producer's events.
const webhookAnnounced = `(aggregate_id LIKE 'sub\_chaoswh%' OR aggregate_id LIKE 'wh-tenant-%' OR aggregate_id LIKE 'in\_chaoswh%')`

// dropWebhookEvents removes from the domain-event checker's rows those of
// events the inbox announced for the sender's customers.
func (r *run) dropWebhookEvents(ctx context.Context, outbox map[string]string, inbox []inboxRow, posts []postingRow) ([]inboxRow, []postingRow, error) {
	rows, err := r.pool.Query(ctx, `SELECT event_id::text FROM event_outbox WHERE `+webhookAnnounced)
	if err != nil {
		return nil, nil, err
	}
	drop := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, nil, err
		}
		drop[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	for id := range drop {
		delete(outbox, id)
	}
	keptIn := inbox[:0]
	for _, in := range inbox {
		if !drop[in.eventID] {
			keptIn = append(keptIn, in)
		}
	}
	keptPosts := posts[:0]
	for _, p := range posts {
		if !drop[p.eventID] {
			keptPosts = append(keptPosts, p)
		}
	}
	return keptIn, keptPosts, nil
}

// healInboxes waits for every inbox's /readyz after the heal; one not
// ready within a minute is a failure of the run (run.notReady).
func (r *run) healInboxes(ctx context.Context) {
	for i, addr := range r.inboxAddrs() {
		if err := waitHTTP(ctx, "http://"+addr+"/readyz", 60*time.Second); err != nil && ctx.Err() == nil {
			r.notReady = append(r.notReady, fmt.Sprintf("inbox-%d not ready 60 s after the heal: %v", i, err))
		}
	}
}
