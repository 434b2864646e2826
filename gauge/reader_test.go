package gauge_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/gauge"
	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/reconciler"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/outbox"
)

type fixtures struct {
	items    func(...item)
	events   func(...event)
	findings func(...finding)
}

func newReader(t *testing.T, cfg gauge.Config) (*gauge.Reader, fixtures) {
	t.Helper()
	pool := dbtest.New(t)
	r, err := gauge.NewReader(pool, cfg, gauge.WithClock(clock.NewManual(testNow)))
	if err != nil {
		t.Fatal(err)
	}
	return r, fixtures{
		items:    func(it ...item) { insertItems(t, pool, it...) },
		events:   func(ev ...event) { insertEvents(t, pool, ev...) },
		findings: func(fs ...finding) { insertFindings(t, pool, fs...) },
	}
}

func TestReadEmptyDatabaseIsAllZeroWithEveryLabel(t *testing.T) {
	r, _ := newReader(t, gauge.DefaultConfig())
	s, err := r.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !s.MeasuredAt.Equal(testNow) {
		t.Errorf("MeasuredAt = %v, want the injected clock's %v", s.MeasuredAt, testNow)
	}
	for _, st := range gauge.BacklogStates {
		if v, ok := s.Outbox.BacklogAgeSeconds[st]; !ok || v != 0 {
			t.Errorf("backlog age %s = %v (present %v), want 0", st, v, ok)
		}
	}
	for _, st := range gauge.CountedStates {
		if v, ok := s.Outbox.Items[st]; !ok || v != 0 {
			t.Errorf("items %s = %v (present %v), want 0", st, v, ok)
		}
	}
	for _, reason := range append(outbox.Reasons, gauge.ReasonOther) {
		if v, ok := s.Outbox.QuarantinedByReason[string(reason)]; !ok || v != 0 {
			t.Errorf("quarantined %s = %v (present %v), want 0", reason, v, ok)
		}
	}
	for _, reason := range append(inbox.Reasons, gauge.ReasonOther) {
		if v, ok := s.Inbox.DeadLetters[string(reason)]; !ok || v != 0 {
			t.Errorf("dead letters %s = %v (present %v), want 0", reason, v, ok)
		}
	}
	for _, k := range reconciler.Kinds {
		if v, ok := s.Reconciliation.OpenByKind[string(k)]; !ok || v != 0 {
			t.Errorf("reconciliation open %s = %v (present %v), want 0", k, v, ok)
		}
	}
	if s.Outbox.LastItemID != 0 || s.Inbox.Pending != 0 || s.Inbox.HighestPendingAttempts != 0 || s.Inbox.OldestPendingAgeSeconds != 0 || s.Outbox.UncertainOldestAgeSeconds != 0 {
		t.Errorf("non-zero figure on an empty database: %+v", s)
	}
}

func TestReadMeasuresEveryFigure(t *testing.T) {
	r, fx := newReader(t, gauge.DefaultConfig())
	fx.findings(
		finding{kind: string(reconciler.KindSummaryShortfall), seen: 30 * time.Hour},
		finding{kind: string(reconciler.KindSummaryShortfall), seen: time.Hour},
		finding{kind: string(reconciler.KindAsyncRejection), seen: 2 * time.Hour},
		finding{kind: string(reconciler.KindSummaryExcess), seen: 90 * time.Hour, resolved: true}, // resolved: in no figure
	)
	fx.items(
		item{state: outbox.StatePending, staged: 90 * time.Second},
		item{state: outbox.StatePending, staged: 30 * time.Second},
		item{state: outbox.StateLeased, staged: 20 * time.Second},
		item{state: outbox.StateAccepted, staged: 2 * time.Hour},
		item{state: outbox.StateConfirmed, staged: 48 * time.Hour}, // terminal: in no figure
		item{state: outbox.StateRejected, staged: 48 * time.Hour},  // terminal: in no figure
		item{state: outbox.StateUncertain, staged: 5 * time.Hour, changed: 3 * time.Hour},
		item{state: outbox.StateUncertain, staged: time.Hour, changed: 10 * time.Minute},
		item{state: outbox.StateQuarantined, reason: string(outbox.ReasonCustomerMissing)},
		item{state: outbox.StateQuarantined, reason: string(outbox.ReasonCustomerMissing)},
		item{state: outbox.StateQuarantined, reason: string(outbox.ReasonFeatureUnmapped)},
		item{state: outbox.StateQuarantined, reason: "written_by_hand"},
	)
	fx.events(
		event{received: 10 * time.Minute, attempts: 3},
		event{received: time.Minute, attempts: 1},
		event{received: time.Hour, attempts: 12, dead: string(inbox.ReasonUnmappedStripePrice)}, // excluded from highest pending
		event{received: time.Hour, attempts: 1, dead: "from_a_newer_version"},
		event{received: 48 * time.Hour, attempts: 1, done: true},
	)
	s, err := r.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"backlog pending", s.Outbox.BacklogAgeSeconds[outbox.StatePending], 90},
		{"backlog leased", s.Outbox.BacklogAgeSeconds[outbox.StateLeased], 20},
		{"backlog accepted", s.Outbox.BacklogAgeSeconds[outbox.StateAccepted], 7200},
		{"items pending", float64(s.Outbox.Items[outbox.StatePending]), 2},
		{"items leased", float64(s.Outbox.Items[outbox.StateLeased]), 1},
		{"items uncertain", float64(s.Outbox.Items[outbox.StateUncertain]), 2},
		{"items quarantined", float64(s.Outbox.Items[outbox.StateQuarantined]), 4},
		{"uncertain oldest (since it became uncertain)", s.Outbox.UncertainOldestAgeSeconds, 3 * 3600},
		{"quarantined customer_missing", float64(s.Outbox.QuarantinedByReason[string(outbox.ReasonCustomerMissing)]), 2},
		{"quarantined feature_unmapped", float64(s.Outbox.QuarantinedByReason[string(outbox.ReasonFeatureUnmapped)]), 1},
		{"quarantined other", float64(s.Outbox.QuarantinedByReason[gauge.ReasonOther]), 1},
		{"quarantined total", float64(s.Outbox.QuarantinedTotal()), 4},
		{"last item id", float64(s.Outbox.LastItemID), float64(s.Outbox.LastItemID)}, // checked below
		{"inbox pending", float64(s.Inbox.Pending), 2},
		{"inbox highest pending attempts", float64(s.Inbox.HighestPendingAttempts), 3},
		{"inbox oldest pending", s.Inbox.OldestPendingAgeSeconds, 600},
		{"inbox dead unmapped_stripe_price", float64(s.Inbox.DeadLetters[string(inbox.ReasonUnmappedStripePrice)]), 1},
		{"inbox dead other", float64(s.Inbox.DeadLetters[gauge.ReasonOther]), 1},
		{"inbox dead total", float64(s.Inbox.DeadLetterTotal()), 2},
		{"recon open summary_shortfall", float64(s.Reconciliation.OpenByKind[string(reconciler.KindSummaryShortfall)]), 2},
		{"recon open async_rejection", float64(s.Reconciliation.OpenByKind[string(reconciler.KindAsyncRejection)]), 1},
		{"recon open summary_excess (resolved)", float64(s.Reconciliation.OpenByKind[string(reconciler.KindSummaryExcess)]), 0},
		{"recon open total", float64(s.Reconciliation.OpenTotal()), 3},
		{"recon oldest summary_shortfall", s.Reconciliation.OldestOpenAgeSecondsByKind[string(reconciler.KindSummaryShortfall)], 30 * 3600},
		{"recon oldest async_rejection", s.Reconciliation.OldestOpenAgeSecondsByKind[string(reconciler.KindAsyncRejection)], 2 * 3600},
		{"recon oldest overall", s.Reconciliation.OldestOpenAgeSeconds(), 30 * 3600},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if s.Outbox.LastItemID < 12 {
		t.Errorf("last item id = %d, want ≥ 12 (12 rows staged)", s.Outbox.LastItemID)
	}
}

func TestCountsStopAtTheCap(t *testing.T) {
	cfg := gauge.DefaultConfig()
	cfg.CountCap = gauge.CountCapMin
	r, fx := newReader(t, cfg)
	var many []item
	for range cfg.CountCap + 20 {
		many = append(many, item{state: outbox.StateQuarantined, reason: string(outbox.ReasonPeriodBuffered)})
	}
	fx.items(many...)
	s, err := r.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Outbox.Items[outbox.StateQuarantined]; got != int64(cfg.CountCap) {
		t.Errorf("quarantined count = %d, want the cap %d", got, cfg.CountCap)
	}
	if got := s.Outbox.QuarantinedByReason[string(outbox.ReasonPeriodBuffered)]; got != int64(cfg.CountCap) {
		t.Errorf("period_buffered count = %d, want the cap %d", got, cfg.CountCap)
	}
	if s.CountCap != cfg.CountCap {
		t.Errorf("snapshot cap = %d, want %d", s.CountCap, cfg.CountCap)
	}
}

func TestReadFailsWithErrQueryWhenTheDatabaseIsGone(t *testing.T) {
	pool := dbtest.New(t)
	r, err := gauge.NewReader(pool, gauge.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	s, err := r.Read(context.Background())
	if !errors.Is(err, gauge.ErrQuery) {
		t.Fatalf("Read on a closed pool: err = %v, want ErrQuery", err)
	}
	if s.Outbox.Items != nil || s.Outbox.BacklogAgeSeconds != nil {
		t.Errorf("a failed Read returned figures: %+v", s)
	}
}

func TestConfigValidateNamesTheVariable(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(*gauge.Config)
		want string
	}{
		{"timeout low", func(c *gauge.Config) { c.QueryTimeoutMS = 99 }, "AURORA_GAUGES_QUERY_TIMEOUT_MS"},
		{"timeout high", func(c *gauge.Config) { c.QueryTimeoutMS = 60001 }, "AURORA_GAUGES_QUERY_TIMEOUT_MS"},
		{"cap low", func(c *gauge.Config) { c.CountCap = 99 }, "AURORA_GAUGES_COUNT_CAP"},
		{"cap high", func(c *gauge.Config) { c.CountCap = 10000001 }, "AURORA_GAUGES_COUNT_CAP"},
		{"interval negative", func(c *gauge.Config) { c.MinIntervalMS = -1 }, "AURORA_GAUGES_MIN_INTERVAL_MS"},
		{"interval high", func(c *gauge.Config) { c.MinIntervalMS = 60001 }, "AURORA_GAUGES_MIN_INTERVAL_MS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := gauge.DefaultConfig()
			c.mod(&cfg)
			err := cfg.Validate()
			var re *config.RangeError
			if !errors.As(err, &re) || re.Var != c.want || !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("Validate() = %v, want a RangeError naming %s", err, c.want)
			}
			if _, err := gauge.NewReader(nil, cfg); !errors.Is(err, config.ErrInvalid) {
				t.Errorf("NewReader accepted an invalid config: %v", err)
			}
		})
	}
	if err := gauge.DefaultConfig().Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	var loaded gauge.Config
	if err := config.LoadFrom(&loaded, map[string]string{}); err != nil || loaded != gauge.DefaultConfig() {
		t.Errorf("env defaults = %+v (%v), want DefaultConfig %+v", loaded, err, gauge.DefaultConfig())
	}
}

// Domain events: the dispatch backlog, dead letters (the outbox's and each
// consumer's) and each consumer's catch-up lag, by the consumer's own rule
// (dispatched, of its types, neither processed nor dead-lettered by it).
func TestReadMeasuresDomainEvents(t *testing.T) {
	pool := dbtest.New(t)
	r, err := gauge.NewReader(pool, gauge.DefaultConfig(), gauge.WithClock(clock.NewManual(testNow)))
	if err != nil {
		t.Fatal(err)
	}
	insertDomainEvents(t, pool,
		map[string][]string{
			"ledger":  {"InvoicePaid.v1"},
			"mailer":  {"InvoicePaid.v1", "SubscriptionChanged.v1"},
			"idle":    {"EntitlementChanged.v1"},
			"stopped": {"SubscriptionChanged.v1"},
		},
		domainEvent{eventType: "InvoicePaid.v1", status: "pending", created: 40 * time.Second},
		domainEvent{eventType: "InvoicePaid.v1", status: "failed", created: 70 * time.Second},
		domainEvent{eventType: "InvoicePaid.v1", status: "dead_letter", created: time.Hour},
		domainEvent{eventType: "InvoicePaid.v1", status: "acknowledged", created: 3 * time.Hour, dispatched: 3 * time.Hour,
			processed: []string{"ledger", "mailer"}}, // terminal: lag of nobody
		// ledger processed it, mailer did not: mailer lags 20 min
		domainEvent{eventType: "InvoicePaid.v1", status: "dispatched", created: 21 * time.Minute, dispatched: 20 * time.Minute,
			processed: []string{"ledger"}},
		// ledger dead-lettered this one (past it: no lag, one dead letter); mailer processed it
		domainEvent{eventType: "InvoicePaid.v1", status: "dispatched", created: 50 * time.Minute, dispatched: 45 * time.Minute,
			processed: []string{"mailer"}, dead: []string{"ledger"}},
		// nobody processed it yet: stopped lags 2 h, mailer too (older than its 20 min)
		domainEvent{eventType: "SubscriptionChanged.v1", status: "dispatched", created: 2 * time.Hour, dispatched: 2 * time.Hour},
	)
	s, err := r.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"undispatched oldest", s.Events.UndispatchedOldestAgeSeconds, 70},
		{"outbox dead letters", float64(s.Events.OutboxDeadLetters), 1},
		{"ledger dead letters", float64(s.Events.ConsumerDeadLetters["ledger"]), 1},
		{"mailer dead letters", float64(s.Events.ConsumerDeadLetters["mailer"]), 0},
		{"consumer dead letters total", float64(s.Events.ConsumerDeadLetterTotal()), 1},
		{"ledger lag", s.Events.ConsumerLagSeconds["ledger"], 0},
		{"mailer lag", s.Events.ConsumerLagSeconds["mailer"], 2 * 3600},
		{"stopped lag", s.Events.ConsumerLagSeconds["stopped"], 2 * 3600},
		{"idle lag", s.Events.ConsumerLagSeconds["idle"], 0},
		{"max lag", s.Events.MaxConsumerLagSeconds(), 2 * 3600},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	for _, name := range []string{"ledger", "mailer", "idle", "stopped"} {
		if _, ok := s.Events.ConsumerLagSeconds[name]; !ok {
			t.Errorf("consumer %s has no lag figure (every registered consumer must have one)", name)
		}
	}
}
