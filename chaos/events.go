package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/shared/events"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// Domain events and their consumers in the harness.
//
// The producer publishes one InvoicePaid.v1 per InvoiceEvery staged items,
// in the staging transaction (events.Publish), so the event commits with
// the usage it goes with. `aurora relay` dispatches it to AURORA_EVENTS.
// Two processes of the example ledger (examples/ledger) consume it as ONE
// consumer group ("ledger"): they share the durable JetStream consumer
// and both run the catch-up loop over the same dispatched events, so every
// event is raced for by two claimers in two processes (and by the two
// paths of each); only the inbox key (consumer, event_id) keeps the
// posting single. Two consumers of different names would each post to the
// same ledger tables (keyed by event id) and collide by construction; one
// group with two processes is what tests the dedupe.
//
// `aurora reconciler` runs as its own process too: it confirms accepted
// items against the emulator's meter event summaries; after the drain the
// harness runs `aurora reconciler --once` and checks what it found.

// InvoiceEvery: the producer publishes one InvoicePaid.v1 for every
// InvoiceEvery-th staged item (item index i with i % InvoiceEvery == 0).
const InvoiceEvery = 5

// ledgerConsumer is the consumer name both ledger processes run with.
const ledgerConsumer = "ledger"

// ledgerProcesses: processes of the ledger consumer group.
const ledgerProcesses = 2

// The fault kinds of the event consumers and the reconciler.
const (
	// FaultKillConsumer: kill -9 of a ledger process picked by the seed,
	// restarted after the downtime (0.5–3 s).
	FaultKillConsumer FaultKind = "kill_consumer"
	// FaultKillReconciler: kill -9 of the reconciler, restarted after the
	// downtime (0.5–3 s).
	FaultKillReconciler FaultKind = "kill_reconciler"
)

// eventsPart is the run's domain-event state: the processes and what the
// producer published.
type eventsPart struct {
	ledgers    []*proc
	recon      *proc
	reconHTTP  string
	reconEnv   []string
	mu         sync.Mutex
	amountByID map[string]int64 // event id → amount (minor units), by item index i % InvoiceEvery == 0
	idByIndex  map[int]string
}

// invoiceID is the event id of the invoice announced at item index i:
// stable, so a batch retried after an unclear commit publishes it once.
func invoiceID(seed uint64, i int) string {
	return events.IDFor("aurora-chaos-invoice", strconv.FormatUint(seed, 10), strconv.Itoa(i))
}

// invoiceEvent returns the InvoicePaid.v1 of item index i (ev the item):
// an inbox.InvoiceOutcome payload whose amount is 100 × the item's
// quantity, in usd.
func invoiceEvent(seed uint64, i int, ev usage.Event, at time.Time) (events.Event, int64, error) {
	amount := ev.Quantity * 100
	p := inbox.InvoiceOutcome{Tenant: ev.Tenant, InvoiceID: fmt.Sprintf("in_chaos_%d_%06d", seed, i),
		SubscriptionID: "sub_chaos_" + ev.Tenant, Amount: &amount, Currency: "usd",
		StripeEventID: fmt.Sprintf("evt_chaos_%d_%06d", seed, i), StripeEventCreated: at.UTC().Truncate(time.Second)}
	b, err := json.Marshal(p)
	if err != nil {
		return events.Event{}, 0, err
	}
	return events.Event{ID: invoiceID(seed, i), Type: inbox.EventInvoicePaid, AggregateID: p.InvoiceID, Payload: b}, amount, nil
}

// publishInvoices publishes, in tx, the InvoicePaid.v1 of every item of
// batch (items first..first+len-1) whose index is a multiple of
// InvoiceEvery. An event already stored (a retry after a commit whose
// answer was lost) is not an error.
func (r *run) publishInvoices(ctx context.Context, tx pgx.Tx, first int, batch []usage.Event) error {
	for k, ev := range batch {
		i := first + k
		if i%InvoiceEvery != 0 || ev.CorrectsEventID != "" {
			continue // corrections are not invoiced
		}
		e, amount, err := invoiceEvent(r.o.Seed, i, ev, time.Now())
		if err != nil {
			return err
		}
		if _, err := events.Publish(ctx, tx, e); err != nil && !errors.Is(err, events.ErrDuplicateEvent) {
			return err
		}
		r.ev.mu.Lock()
		r.ev.amountByID[e.ID] = amount
		r.ev.idByIndex[i] = e.ID
		r.ev.mu.Unlock()
	}
	return nil
}

// published returns the events the producer committed: those of the
// first staged items.
func (r *run) published(staged int) map[string]int64 {
	r.ev.mu.Lock()
	defer r.ev.mu.Unlock()
	out := map[string]int64{}
	for i := 0; i < staged; i += InvoiceEvery {
		if id, ok := r.ev.idByIndex[i]; ok {
			out[id] = r.ev.amountByID[id]
		}
	}
	return out
}

// startEvents starts the ledger processes (one after the other: the first
// creates the ledger's tables and registers the consumer, so the second
// does not race it on CREATE TABLE) and the reconciler, and waits until
// the consumer is registered and the reconciler ready. Called before the
// producer starts, so no event is acknowledged before the consumer counts.
func (r *run) startEvents(ctx context.Context) error {
	r.ev.amountByID, r.ev.idByIndex = map[string]int64{}, map[int]string{}
	for i := range ledgerProcesses {
		p := &proc{name: fmt.Sprintf("ledger-%d", i), supervise: true, bin: r.o.Bin.Ledger, dir: r.dir,
			args: []string{"--consumer", ledgerConsumer}, env: env(
				"AURORA_DATABASE_URL="+r.dbURL, "AURORA_NATS_URL="+r.natsURL,
				"AURORA_EVENTS_CONSUMER_INTERVAL_MS=100", "AURORA_EVENTS_CONSUMER_ACK_WAIT_SECONDS=5",
				"AURORA_EVENTS_CONSUMER_BACKOFF_BASE_MS=200", "AURORA_EVENTS_CONSUMER_BACKOFF_CAP_MS=2000",
				"AURORA_EVENTS_STREAM_REPLICAS="+strconv.Itoa(r.o.NATSNodes))}
		if err := p.start(); err != nil {
			return err
		}
		r.ev.ledgers = append(r.ev.ledgers, p)
		if i == 0 {
			if err := r.waitConsumer(ctx, 60*time.Second); err != nil {
				return err
			}
		}
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	r.ev.reconHTTP = "127.0.0.1:" + strconv.Itoa(port)
	r.ev.reconEnv = env("AURORA_DATABASE_URL="+r.dbURL, "AURORA_STRIPE_API_KEY="+stripeKey, "AURORA_STRIPE_API_BASE="+r.emuURL,
		"AURORA_STRIPE_ACCOUNT="+account, "AURORA_STRIPE_MODE=test",
		// every minute (the least it takes), windows compared as soon as
		// their minute is over (no settle lag: a window with an item in
		// flight is not decided anyway), nothing unconfirmed within a run
		"AURORA_RECONCILER_INTERVAL_SECONDS=60", "AURORA_RECONCILER_SETTLE_LAG_SECONDS=0",
		"AURORA_RECONCILER_CONFIRM_HORIZON_SECONDS=3600", "AURORA_RECONCILER_LOOKBACK_HOURS=2",
		"AURORA_RECONCILER_REQUESTS_PER_SECOND=50")
	r.ev.recon = &proc{name: "reconciler", supervise: true, bin: r.o.Bin.Aurora, dir: r.dir, args: []string{"reconciler"},
		env: append(append([]string{}, r.ev.reconEnv...), "AURORA_RECONCILER_HTTP_ADDR="+r.ev.reconHTTP)}
	if err := r.ev.recon.start(); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "http://"+r.ev.reconHTTP+"/readyz", 60*time.Second); err != nil {
		return err
	}
	r.logf("%d ledger processes (consumer %q) and the reconciler ready", len(r.ev.ledgers), ledgerConsumer)
	return nil
}

// waitConsumer waits until the ledger consumer is registered.
func (r *run) waitConsumer(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var n int
		err := r.pool.QueryRow(ctx, `SELECT count(*) FROM event_consumers WHERE consumer = $1`, ledgerConsumer).Scan(&n)
		if err == nil && n == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: consumer %s not registered after %s (see ledger-0.log)", ErrSetup, ledgerConsumer, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// eventProcs returns the ledger processes and the reconciler (those started).
func (r *run) eventProcs() []*proc {
	out := append([]*proc{}, r.ev.ledgers...)
	if r.ev.recon != nil {
		out = append(out, r.ev.recon)
	}
	return out
}

// healEvents starts what is down of the ledgers and the reconciler (a
// supervised restart may win the race) and waits for the reconciler.
func (r *run) healEvents(ctx context.Context) error {
	if err := resumeOrStart(r.eventProcs()); err != nil {
		return err
	}
	if r.ev.recon == nil {
		return nil
	}
	return waitHTTP(ctx, "http://"+r.ev.reconHTTP+"/readyz", 60*time.Second)
}

// stopEvents stops the ledgers and the reconciler (teardown).
func (r *run) stopEvents() {
	for _, p := range r.eventProcs() {
		p.stop(10 * time.Second)
	}
}

// chooseEvents returns the target of a kill_consumer (a running ledger
// picked by pick) or kill_reconciler fault; nil when none runs.
func (r *run) chooseEvents(pl Planned) *proc {
	switch pl.Kind {
	case FaultKillConsumer:
		var up []*proc
		for _, p := range r.ev.ledgers {
			if p.current() == procRunning {
				up = append(up, p)
			}
		}
		if len(up) > 0 {
			return up[int(pl.Pick*float64(len(up)))]
		}
	case FaultKillReconciler:
		if r.ev.recon != nil && r.ev.recon.current() == procRunning {
			return r.ev.recon
		}
	}
	return nil
}

// reconcileOnce runs `aurora reconciler --once` (a process of its own,
// after the drain) and returns its report; a failed run is tried again,
// three times in all.
func (r *run) reconcileOnce(ctx context.Context) (reconRunReport, error) {
	var last error
	for attempt := range 3 {
		if attempt > 0 {
			time.Sleep(2 * time.Second)
		}
		cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		cmd := exec.CommandContext(cctx, r.o.Bin.Aurora, "reconciler", "--once")
		cmd.Env = r.ev.reconEnv
		logf, err := os.OpenFile(r.dir+"/reconciler-once.log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			cancel()
			return reconRunReport{}, err
		}
		cmd.Stderr = logf
		out, err := cmd.Output()
		logf.Close()
		cancel()
		if err != nil {
			last = fmt.Errorf("chaos: aurora reconciler --once: %w (see reconciler-once.log)", err)
			continue
		}
		var rep reconRunReport
		if err := json.Unmarshal(out, &rep); err != nil {
			last = fmt.Errorf("chaos: aurora reconciler --once: report: %w", err)
			continue
		}
		return rep, nil
	}
	return reconRunReport{}, last
}

// reconRunReport is the part of reconciler.RunReport (the JSON `aurora
// reconciler --once` prints) the checker reads.
type reconRunReport struct {
	RunID            int64          `json:"run_id"`
	WindowsCompared  int            `json:"windows_compared"`
	WindowsMatched   int            `json:"windows_matched"`
	WindowsUnsettled int            `json:"windows_unsettled"`
	ItemsConfirmed   int            `json:"items_confirmed"`
	Findings         map[string]int `json:"findings_by_kind"`
}
