package stripeemulator_test

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/stripeemulator"
	"github.com/stripe/stripe-go/v76"
)

// An emulator restarted from its state file keeps its meters (same ids),
// customers and applied totals, still refuses an applied identifier as a
// duplicate within the window, and generates ids the first run never did.
func TestStateFileSurvivesRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stripeemulator.Config{Seed: 3})
	if _, err := e.sc.BillingMeterEvents.New(event("evt-1", custA, "3", epoch)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sc.BillingMeterEvents.New(event("evt-2", custB, "2.5", epoch)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sc.BillingMeterEventAdjustments.New(&stripe.BillingMeterEventAdjustmentParams{
		EventName: stripe.String(eventName), Type: stripe.String("cancel"),
		Cancel: &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String("evt-2")}}); err != nil {
		t.Fatal(err)
	}
	created, err := e.sc.Customers.New(&stripe.CustomerParams{Name: stripe.String("Org")})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "emulator.json")
	if err := e.emu.SaveStateFile(path); err != nil {
		t.Fatal(err)
	}
	before := e.emu.Stats()

	// The restart: a new emulator with the same seed, loading the file.
	r := newRestarted(t, e, path)
	if got := r.emu.Meters(); len(got) != 1 || got[0].ID != e.meter.ID || got[0].EventName != eventName {
		t.Fatalf("meters after restart %+v, want %s", got, e.meter.ID)
	}
	if c, err := r.sc.Customers.Get(created.ID, nil); err != nil || c.Name != "Org" {
		t.Fatalf("customer after restart: %+v %v", c, err)
	}
	after := r.emu.Stats()
	if after.Applied != before.Applied || after.Cancelled != 1 || after.AppliedTotals[eventName] != before.AppliedTotals[eventName] {
		t.Fatalf("stats before %+v after %+v", before, after)
	}
	p := event("evt-1", custA, "3", epoch)
	p.SetIdempotencyKey("after-restart")
	if _, err := r.sc.BillingMeterEvents.New(p); stripeErr(t, err).HTTPStatusCode != 400 {
		t.Fatal("evt-1 applied again after the restart")
	}
	if n := r.emu.Applications("evt-1"); n != 1 {
		t.Fatalf("evt-1 applied %d times", n)
	}
	if _, err := r.sc.BillingMeterEvents.New(event("evt-3", created.ID, "4", epoch)); err != nil {
		t.Fatalf("event for a customer created before the restart: %v", err)
	}
	m, err := r.emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "Egress", EventName: "egress_bytes"})
	if err != nil || m.ID == e.meter.ID {
		t.Fatalf("new meter %+v %v: ids must not repeat", m, err)
	}
	// And a second restart from the second run's state.
	if err := r.emu.SaveStateFile(path); err != nil {
		t.Fatal(err)
	}
	r2 := newRestarted(t, e, path)
	if got := r2.emu.Meters(); len(got) != 2 || r2.emu.Applications("evt-3") != 1 {
		t.Fatalf("second restart: meters %d, evt-3 %d", len(got), r2.emu.Applications("evt-3"))
	}
}

func newRestarted(t *testing.T, e *env, path string) *env {
	t.Helper()
	emu, err := stripeemulator.New(stripeemulator.Config{Seed: 3, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := emu.LoadStateFile(path); !ok || err != nil {
		t.Fatalf("load: %v %v", ok, err)
	}
	srv := newServer(t, emu)
	return &env{t: t, emu: emu, srv: srv, sc: stripeClient(srv.URL, testKey, nil), clock: e.clock}
}

func TestLoadStateRefusesBadFiles(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{`{`, `{"version":2}`, `{"version":1,"extra":1}`,
		`{"version":1,"meters":[],"customers":[],"events":[{"identifier":"x","meter_id":"mtr_none","customer":"c","value":"1"}]}`,
		`{"version":1,"customers":[{"id":"c"},{"id":"c"}]}`} {
		emu, _ := stripeemulator.New(stripeemulator.Config{})
		if err := emu.AddCustomer("cus_keep"); err != nil {
			t.Fatal(err)
		}
		if err := emu.LoadState(strings.NewReader(bad)); !errors.Is(err, stripeemulator.ErrInvalidState) {
			t.Errorf("%s: %v", bad, err)
		}
		var buf bytes.Buffer
		_ = emu.SaveState(&buf)
		if !strings.Contains(buf.String(), "cus_keep") {
			t.Errorf("%s: a refused load changed the emulator", bad)
		}
	}
	emu, _ := stripeemulator.New(stripeemulator.Config{})
	if ok, err := emu.LoadStateFile(filepath.Join(t.TempDir(), "none.json")); ok || err != nil {
		t.Fatalf("missing file: %v %v", ok, err)
	}
}

func newServer(t *testing.T, emu *stripeemulator.Emulator) *httptest.Server {
	srv := httptest.NewServer(emu)
	t.Cleanup(srv.Close)
	return srv
}
