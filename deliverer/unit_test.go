package deliverer

import (
	"unicode/utf8"

	"errors"
	"github.com/nats-io/nats.go/jetstream"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	base, cap := 5*time.Second, 900*time.Second
	tests := []struct {
		attempts int
		full     time.Duration
	}{{0, 5 * time.Second}, {1, 5 * time.Second}, {2, 10 * time.Second}, {3, 20 * time.Second}, {8, 640 * time.Second}, {9, 900 * time.Second}, {200, 900 * time.Second}}
	for _, tt := range tests {
		lo := Backoff(tt.attempts, base, cap, func() float64 { return 0 })
		hi := Backoff(tt.attempts, base, cap, func() float64 { return 0.999999 })
		if lo != tt.full/2 || hi > tt.full || hi < tt.full-time.Millisecond {
			t.Errorf("attempts %d: [%s, %s], want [%s, %s]", tt.attempts, lo, hi, tt.full/2, tt.full)
		}
	}
	for range 1000 {
		if d := Backoff(3, base, cap, nil); d < 10*time.Second || d > 20*time.Second {
			t.Fatalf("jitter out of range: %s", d)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var loaded Config
	if err := config.LoadFrom(&loaded, map[string]string{}); err != nil || loaded.FilterSubject != DefaultFilterSubject() || loaded.Concurrency != ConcurrencyDefault || loaded.StreamLingerMillis != DefaultConfig().StreamLingerMillis || loaded.BatchLingerMillis != BatchLingerMillisDefault {
		t.Fatalf("load defaults: %+v %v", loaded, err)
	}
	bad := []struct {
		env map[string]string
		v   string
	}{
		{map[string]string{"AURORA_DELIVERER_CONCURRENCY": "0"}, "AURORA_DELIVERER_CONCURRENCY"},
		{map[string]string{"AURORA_DELIVERER_FILTER_SUBJECT": "other.>"}, "AURORA_DELIVERER_FILTER_SUBJECT"},
		{map[string]string{"AURORA_DELIVERER_CONSUMER": "a.b"}, "AURORA_DELIVERER_CONSUMER"},
		{map[string]string{"AURORA_DELIVERER_FILTER_SUBJECT": "aurora.outbox.x.a,other.b"}, "AURORA_DELIVERER_FILTER_SUBJECT"},
		{map[string]string{"AURORA_STRIPE_TIMEOUT_SECONDS": "120"}, "config: AURORA_STRIPE_TIMEOUT_SECONDS=120 (set) must be less than AURORA_OUTBOX_LEASE_SECONDS=120 (its default)"},
		// the lease was set, the timeout left at its default: the lease is named
		{map[string]string{"AURORA_OUTBOX_LEASE_SECONDS": "30"}, "config: AURORA_OUTBOX_LEASE_SECONDS=30 (set) must be more than AURORA_STRIPE_TIMEOUT_SECONDS=30 (its default): a Stripe call must end within the item's lease; change AURORA_OUTBOX_LEASE_SECONDS or set AURORA_STRIPE_TIMEOUT_SECONDS"},
		{map[string]string{"AURORA_OUTBOX_LEASE_SECONDS": "30", "AURORA_STRIPE_TIMEOUT_SECONDS": "40"}, "config: AURORA_STRIPE_TIMEOUT_SECONDS=40 (set) must be less than AURORA_OUTBOX_LEASE_SECONDS=30 (set)"},
		{map[string]string{"AURORA_OUTBOX_LEASE_SECONDS": "99999999999999999999"}, "config: AURORA_OUTBOX_LEASE_SECONDS=99999999999999999999 is out of range; allowed 5..3600 (seconds)"},
		{map[string]string{"AURORA_DELIVERER_ACK_WAIT_SECONDS": "1"}, "AURORA_DELIVERER_ACK_WAIT_SECONDS"},
		{map[string]string{"AURORA_UNCERTAINTY_HORIZON_SECONDS": "86400"}, "AURORA_UNCERTAINTY_HORIZON_SECONDS"},
		{map[string]string{"AURORA_DELIVERER_BUSY_DELAY_MS": "x"}, "AURORA_DELIVERER_BUSY_DELAY_MS"},
		{map[string]string{"AURORA_DELIVERER_PINNED_TTL_SECONDS": "0"}, "AURORA_DELIVERER_PINNED_TTL_SECONDS"},
		{map[string]string{"AURORA_DELIVERER_STREAM_LINGER_MS": "0"}, "AURORA_DELIVERER_STREAM_LINGER_MS=0 is out of range; allowed 1..100"},
		{map[string]string{"AURORA_DELIVERER_STREAM_LINGER_MS": "101"}, "AURORA_DELIVERER_STREAM_LINGER_MS=101 is out of range; allowed 1..100"},
		{map[string]string{"AURORA_DELIVERER_BATCH_LINGER_MS": "-1"}, "AURORA_DELIVERER_BATCH_LINGER_MS=-1 is out of range; allowed 0..100"},
		{map[string]string{"AURORA_DELIVERER_BATCH_LINGER_MS": "101"}, "AURORA_DELIVERER_BATCH_LINGER_MS=101 is out of range; allowed 0..100"},
		{map[string]string{"AURORA_DELIVERER_FILTER_SUBJECT": "aurora.outbox.x.y.z"}, "AURORA_DELIVERER_FILTER_SUBJECT"},
	}
	for _, b := range bad {
		var c Config
		err := config.LoadFrom(&c, b.env)
		var re *config.RangeError
		if !errors.Is(err, config.ErrInvalid) || !errors.As(err, &re) || !strings.Contains(err.Error(), b.v) {
			t.Errorf("%v: got %v", b.env, err)
		}
	}
}

func TestConsumerConfigPartitions(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	c.FilterSubject = "aurora.outbox.stripe_meter_events.org_a,aurora.outbox.stripe_meter_events.org_b"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	d := &Deliverer{s: c.settings()}
	cc := d.ConsumerConfig(7)
	if cc.Durable != "aurora-deliverer-p07" || cc.FilterSubject != "" || len(cc.FilterSubjects) != 2 ||
		cc.FilterSubjects[1] != "aurora.outbox.stripe_meter_events.org_b.7" || cc.AckWait != 30*time.Second || cc.MaxDeliver != -1 ||
		cc.PriorityPolicy != jetstream.PriorityPolicyPinned || len(cc.PriorityGroups) != 1 || cc.PriorityGroups[0] != PriorityGroup ||
		cc.PinnedTTL != 10*time.Second || cc.MaxAckPending < 4*c.BatchSize*2 {
		t.Fatalf("%+v", cc)
	}
	d = &Deliverer{s: DefaultConfig().settings()}
	if got := d.ConsumerConfig(0).FilterSubject; got != "aurora.outbox.stripe_meter_events.*.0" {
		t.Fatalf("single filter %q", got)
	}
}

func TestFilterFor(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"aurora.outbox.>":                             "aurora.outbox.*.*.3",
		"aurora.outbox.stripe_meter_events.>":         "aurora.outbox.stripe_meter_events.*.3",
		"aurora.outbox.stripe_meter_events.org_1":     "aurora.outbox.stripe_meter_events.org_1.3",
		"aurora.outbox.*.org_1":                       "aurora.outbox.*.org_1.3",
		"aurora.outbox.stripe_meter_events.~0123abcd": "aurora.outbox.stripe_meter_events.~0123abcd.3",
	}
	for in, want := range good {
		if got, err := FilterFor(in, 3); err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"other.>", "aurora.outbox", "aurora.outbox.x.y.z", "aurora.outbox.>.x", "aurora.outbox.x*.y", "aurora.outbox..y"} {
		if _, err := FilterFor(bad, 3); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestOptionsRefuse(t *testing.T) {
	t.Parallel()
	for _, o := range []Option{WithAckWait(time.Millisecond), WithLease(0), WithBusyDelay(0), WithProviderTimeout(-1), WithJitter(nil), WithLogger(nil), WithRegisterer(nil), WithPinnedTTL(0), WithAttachCheck(0), WithLaneShare(0)} {
		if err := o(&Deliverer{}); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("got %v", err)
		}
	}
}

// TestPreSendOrder: the checks fire in the documented order; the first
// failure names the reason.
func TestPreSendOrder(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	s := func(v string) *string { return &v }
	b := func(v bool) *bool { return &v }
	v := func(n int32) *int32 { return &n }
	ok := sendContext{AccountMode: s("test"), AccountConfirmed: b(true), StripeCustomer: s("cus"), MeterID: s("m"), EventName: s("e"), CurrentMappingVersion: v(1)}
	item := checkItem{SubjectKind: identity.SubjectEvent, Mode: identity.ModeTest, MappingVersion: 1, Quantity: 1, OccurredAt: now, PeriodStart: now}
	if f := preSend(item, ok, identity.ModeTest, now); f != nil {
		t.Fatalf("clean item: %+v", f)
	}
	wm := now.Add(time.Hour)
	tests := []struct {
		name string
		mut  func(*checkItem, *sendContext) identity.Mode
		want outbox.Reason
	}{
		{"everything wrong", func(i *checkItem, c *sendContext) identity.Mode {
			*c = sendContext{}
			i.Quantity = -1
			return identity.ModeLive
		}, outbox.ReasonAccountUnconfirmed},
		{"key mode", func(i *checkItem, c *sendContext) identity.Mode { c.StripeCustomer = nil; return identity.ModeLive }, outbox.ReasonModeMismatch},
		{"unmapped before customer", func(i *checkItem, c *sendContext) identity.Mode {
			c.MeterID, c.StripeCustomer = nil, nil
			return identity.ModeTest
		}, outbox.ReasonFeatureUnmapped},
		{"buffered", func(i *checkItem, c *sendContext) identity.Mode { c.Watermark = &wm; return identity.ModeTest }, outbox.ReasonPeriodBuffered},
		{"window not buffered for usage windows", func(i *checkItem, c *sendContext) identity.Mode {
			c.Watermark = &wm
			i.SubjectKind = identity.SubjectUsageWindow
			i.OccurredAt = now.Add(5*time.Minute + time.Second)
			return identity.ModeTest
		}, outbox.ReasonTimestampOutsideWindow},
		{"35 days", func(i *checkItem, c *sendContext) identity.Mode {
			i.OccurredAt = now.Add(-TimestampMaxAge - time.Second)
			return identity.ModeTest
		}, outbox.ReasonTimestampOutsideWindow},
		{"negative", func(i *checkItem, c *sendContext) identity.Mode { i.Quantity = -1; return identity.ModeTest }, outbox.ReasonNegativeQuantity},
	}
	for _, tt := range tests {
		it, sc := item, ok
		km := tt.mut(&it, &sc)
		f := preSend(it, sc, km, now)
		if f == nil || f.Reason != tt.want {
			t.Errorf("%s: got %+v, want %s", tt.name, f, tt.want)
		}
	}
	// boundaries are inside the window
	edge := item
	edge.OccurredAt = now.Add(-TimestampMaxAge)
	if f := preSend(edge, ok, identity.ModeTest, now); f != nil {
		t.Errorf("exactly 35 days: %+v", f)
	}
	edge.OccurredAt = now.Add(TimestampMaxFuture)
	if f := preSend(edge, ok, identity.ModeTest, now); f != nil {
		t.Errorf("exactly +5 min: %+v", f)
	}
}

func TestSanitize(t *testing.T) {
	t.Parallel()
	for _, r := range []Result{{Outcome: OutcomeStaleLease}, {Outcome: "bogus"}, {Outcome: OutcomeQuarantined, Reason: "nope"}} {
		if got := sanitize(r); got.Outcome != OutcomeUncertain {
			t.Errorf("%+v → %+v", r, got)
		}
	}
	if got := sanitize(Result{Outcome: OutcomeQuarantined, Reason: outbox.ReasonCustomerMissing}); got.Outcome != OutcomeQuarantined {
		t.Error(got)
	}
}

func TestTruncateUTF8(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 2, "ab"},
		{"a€b", 2, "a"},           // "€" is 3 bytes: cut before it
		{"a€b", 4, "a€"},          // exactly after it
		{"é", 1, ""},              // nothing fits
		{"a\xffb", 5, "a\uFFFDb"}, // invalid bytes become U+FFFD
	}
	for _, c := range cases {
		if got := truncateUTF8(c.in, c.n); got != c.want || !utf8.ValidString(got) {
			t.Errorf("truncateUTF8(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
