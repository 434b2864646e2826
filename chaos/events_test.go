package chaos

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/shared/usage"
)

func TestInvoiceEventIsStableAndValid(t *testing.T) {
	at := time.Date(2026, 12, 4, 14, 0, 0, 0, time.UTC)
	ev := usage.Event{Tenant: "hot-01", Quantity: 7}
	a, amount, err := invoiceEvent(5, 30, ev, at)
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := invoiceEvent(5, 30, ev, at.Add(time.Minute))
	c, _, _ := invoiceEvent(6, 30, ev, at)
	if a.ID != b.ID || a.ID == c.ID {
		t.Fatalf("ids: same item %s / %s, other seed %s: want equal, then different", a.ID, b.ID, c.ID)
	}
	if err := a.Validate(); err != nil {
		t.Fatalf("event does not validate: %v", err)
	}
	if a.Type != inbox.EventInvoicePaid || amount != 700 {
		t.Fatalf("type %s amount %d, want %s 700", a.Type, amount, inbox.EventInvoicePaid)
	}
	var p inbox.InvoiceOutcome
	if err := json.Unmarshal(a.Payload, &p); err != nil {
		t.Fatal(err)
	}
	// what examples/ledger requires to post
	if p.Tenant != "hot-01" || p.InvoiceID == "" || p.Amount == nil || *p.Amount != 700 || p.Currency != "usd" || a.AggregateID != p.InvoiceID {
		t.Fatalf("payload %+v", p)
	}
}

func TestPublishedIsWhatCommitted(t *testing.T) {
	r := &run{}
	r.ev.amountByID, r.ev.idByIndex = map[string]int64{}, map[int]string{}
	for i := 0; i < 50; i += InvoiceEvery {
		id := invoiceID(1, i)
		r.ev.idByIndex[i], r.ev.amountByID[id] = id, int64(i+1)
	}
	if got, want := len(r.published(2*InvoiceEvery+1)), 3; got != want { // items 0, InvoiceEvery, 2·InvoiceEvery
		t.Fatalf("%d events for %d staged items, want %d", got, 2*InvoiceEvery+1, want)
	}
	if got := len(r.published(0)); got != 0 {
		t.Fatalf("%d events for nothing staged", got)
	}
}

// exactlyOnce builds the database view of published, each processed and
// posted once.
func exactlyOnce(published map[string]int64) (map[string]string, []inboxRow, []postingRow) {
	outbox := map[string]string{}
	var in []inboxRow
	var posts []postingRow
	for id, a := range published {
		outbox[id] = "acknowledged"
		in = append(in, inboxRow{consumer: ledgerConsumer, eventID: id, status: "processed", attempts: 1, duplicates: 2})
		posts = append(posts, postingRow{eventID: id, amount: a, debitSum: a, creditSum: a, debitLines: 1, creditLines: 1})
	}
	return outbox, in, posts
}

func TestJudgeEvents(t *testing.T) {
	published := map[string]int64{invoiceID(1, 0): 100, invoiceID(1, 10): 200, invoiceID(1, 20): 300}
	other := invoiceID(2, 0)
	first := invoiceID(1, 0)
	for _, tc := range []struct {
		name  string
		spoil func(map[string]string, *[]inboxRow, *[]postingRow)
		want  string // a failure containing this; "" = none
	}{
		{"exactly once", func(map[string]string, *[]inboxRow, *[]postingRow) {}, ""},
		{"not processed", func(_ map[string]string, in *[]inboxRow, _ *[]postingRow) { *in = (*in)[1:] }, "not processed and posted"},
		{"not posted", func(_ map[string]string, _ *[]inboxRow, p *[]postingRow) { *p = (*p)[1:] }, "not processed and posted"},
		{"posted twice", func(_ map[string]string, _ *[]inboxRow, p *[]postingRow) { *p = append(*p, (*p)[0]) }, "more than once"},
		{"inbox twice", func(_ map[string]string, in *[]inboxRow, _ *[]postingRow) { *in = append(*in, (*in)[0]) }, "more than once"},
		{"not acknowledged", func(o map[string]string, _ *[]inboxRow, _ *[]postingRow) { o[first] = "dispatched" }, "not acknowledged"},
		{"dispatch dead letter", func(o map[string]string, _ *[]inboxRow, _ *[]postingRow) { o[first] = "dead_letter" }, "dead letters"},
		{"inbox dead letter", func(_ map[string]string, in *[]inboxRow, _ *[]postingRow) {
			(*in)[0].status, (*in)[0].dead = "failed", true
		}, "dead letters"},
		{"extra outbox row", func(o map[string]string, _ *[]inboxRow, _ *[]postingRow) { o[other] = "acknowledged" }, "of no published event"},
		{"extra posting", func(_ map[string]string, _ *[]inboxRow, p *[]postingRow) {
			*p = append(*p, postingRow{eventID: other, amount: 1, debitSum: 1, creditSum: 1, debitLines: 1, creditLines: 1})
		}, "of no published event"},
		{"other consumer", func(_ map[string]string, in *[]inboxRow, _ *[]postingRow) { (*in)[0].consumer = "audit" }, "of no published event"},
		{"wrong amount", func(_ map[string]string, _ *[]inboxRow, p *[]postingRow) { (*p)[0].amount++ }, "do not match"},
		{"unbalanced", func(_ map[string]string, _ *[]inboxRow, p *[]postingRow) { (*p)[0].creditSum-- }, "do not match"},
		{"one line", func(_ map[string]string, _ *[]inboxRow, p *[]postingRow) { (*p)[0].debitLines = 0 }, "do not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, in, p := exactlyOnce(published)
			tc.spoil(o, &in, &p)
			var rep EventsReport
			fails := judgeEvents(&rep, published, ledgerConsumer, o, in, p)
			if tc.want == "" {
				if len(fails) > 0 {
					t.Fatalf("failures %v", fails)
				}
				if rep.Published != 3 || rep.Processed != 3 || rep.Posted != 3 || rep.DuplicatesSkipped != 6 || rep.OutboxByStatus["acknowledged"] != 3 {
					t.Fatalf("report %+v", rep)
				}
				return
			}
			if !strings.Contains(strings.Join(fails, "; "), tc.want) {
				t.Fatalf("failures %v, want one saying %q", fails, tc.want)
			}
		})
	}
}

func TestJudgeReconciler(t *testing.T) {
	clean := func() EventsReport {
		return EventsReport{Confirmed: 100, FinalFindings: map[string]int{}, FindingsOpened: map[string]int{}, FinalWindowsCompared: 44}
	}
	for _, tc := range []struct {
		name  string
		spoil func(*EventsReport)
		want  string
	}{
		{"clean", func(*EventsReport) {}, ""},
		{"transient excess during the load", func(e *EventsReport) { e.FindingsOpened["summary_excess"] = 1 }, ""},
		{"final shortfall", func(e *EventsReport) { e.FinalFindings["summary_shortfall"] = 1 }, "final run found 1 summary_shortfall"},
		{"final excess", func(e *EventsReport) { e.FinalFindings["summary_excess"] = 2 }, "final run found 2 summary_excess"},
		{"async rejection any time", func(e *EventsReport) { e.FindingsOpened["async_rejection"] = 1 }, "async_rejection opened"},
		{"local drift any time", func(e *EventsReport) { e.FindingsOpened["local_drift"] = 1 }, "local_drift opened"},
		{"not all confirmed", func(e *EventsReport) { e.Confirmed = 99 }, "99 of 100 items confirmed"},
		{"unsettled", func(e *EventsReport) { e.FinalWindowsUnsettled = 1 }, "unsettled"},
		{"final run failed", func(e *EventsReport) { e.FinalReconcilerFailure = "exit status 1" }, "final run failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := clean()
			tc.spoil(&e)
			fails := judgeReconciler(&e, 100)
			if tc.want == "" {
				if len(fails) > 0 {
					t.Fatalf("failures %v", fails)
				}
				return
			}
			if !strings.Contains(strings.Join(fails, "; "), tc.want) {
				t.Fatalf("failures %v, want one saying %q", fails, tc.want)
			}
		})
	}
}

func TestChooseEvents(t *testing.T) {
	up := func(name string) *proc { return &proc{name: name, state: procRunning} }
	r := &run{}
	if p := r.chooseEvents(Planned{Kind: FaultKillReconciler}); p != nil {
		t.Fatalf("no reconciler, got %s", p.name)
	}
	r.ev.ledgers = []*proc{up("ledger-0"), {name: "ledger-1"}}
	r.ev.recon = up("reconciler")
	for _, pick := range []float64{0, 0.5, 0.99} {
		if p := r.chooseEvents(Planned{Kind: FaultKillConsumer, Pick: pick}); p == nil || p.name != "ledger-0" {
			t.Fatalf("pick %v: want the running ledger-0, got %v", pick, p)
		}
	}
	if p := r.chooseEvents(Planned{Kind: FaultKillReconciler}); p != r.ev.recon {
		t.Fatalf("got %v, want the reconciler", p)
	}
	r.ev.ledgers[0].state = procDown
	if p := r.chooseEvents(Planned{Kind: FaultKillConsumer}); p != nil {
		t.Fatalf("every ledger down, got %s", p.name)
	}
}

func TestShortScheduleHasEventFaults(t *testing.T) {
	o := Short(5)
	kinds := map[FaultKind]int{}
	s := Schedule(o.Seed, o.StageFor, o.FaultGap, o.Weights)
	for _, f := range s {
		kinds[f.Kind]++
		if (f.Kind == FaultKillConsumer || f.Kind == FaultKillReconciler) && (f.Down < 500*time.Millisecond || f.Down > 3*time.Second) {
			t.Fatalf("%s down %s, want 0.5–3 s", f.Kind, f.Down)
		}
	}
	if len(s) < 50 || kinds[FaultKillConsumer] == 0 || kinds[FaultKillReconciler] == 0 {
		t.Fatalf("%d faults, by kind %v: want ≥ 50 with kill_consumer and kill_reconciler", len(s), kinds)
	}
}
