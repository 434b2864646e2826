package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/stripeemulator"
	stripe "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

func TestStripeEmulatorConfig(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		env     map[string]string
		wantVar string // "" = valid
		check   func(t *testing.T, c emulatorConfig)
	}{
		{name: "defaults", env: map[string]string{}, check: func(t *testing.T, c emulatorConfig) {
			if c.Addr != "127.0.0.1:12112" || c.faults != (stripeemulator.Faults{}) || c.keys != nil {
				t.Fatalf("defaults %+v", c)
			}
		}},
		{name: "demo faults", env: map[string]string{"AURORA_EMULATOR_FAULTS": "drop-after-apply=0.1,http500=0.1,http429=0.1,latency=20ms"},
			check: func(t *testing.T, c emulatorConfig) {
				if c.faults.DropAfterApply != 0.1 || c.faults.Latency != 20*time.Millisecond {
					t.Fatalf("faults %+v", c.faults)
				}
			}},
		{name: "keys", env: map[string]string{"AURORA_EMULATOR_KEYS": "sk_test_a, rk_test_b:denied"},
			check: func(t *testing.T, c emulatorConfig) {
				if len(c.keys) != 2 || c.keys["rk_test_b"] != stripeemulator.AccessDenied || c.keys["sk_test_a"] != stripeemulator.AccessFull {
					t.Fatalf("keys %v", c.keys)
				}
			}},
		{name: "bad faults", env: map[string]string{"AURORA_EMULATOR_FAULTS": "http500=2"}, wantVar: "AURORA_EMULATOR_FAULTS"},
		{name: "bad addr", env: map[string]string{"AURORA_EMULATOR_ADDR": "localhost"}, wantVar: "AURORA_EMULATOR_ADDR"},
		{name: "bad key access", env: map[string]string{"AURORA_EMULATOR_KEYS": "sk_test_a:readonly"}, wantVar: "AURORA_EMULATOR_KEYS"},
		{name: "bad seed", env: map[string]string{"AURORA_EMULATOR_SEED": "-1"}, wantVar: "AURORA_EMULATOR_SEED"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c emulatorConfig
			err := config.LoadFrom(&c, tc.env)
			if tc.wantVar == "" {
				if err != nil {
					t.Fatal(err)
				}
				tc.check(t, c)
				return
			}
			var re *config.RangeError
			if !errors.Is(err, config.ErrInvalid) || !errors.As(err, &re) || re.Var != tc.wantVar {
				t.Fatalf("want a RangeError naming %s, got %v", tc.wantVar, err)
			}
			if strings.Contains(err.Error(), "readonly") && tc.wantVar == "AURORA_EMULATOR_KEYS" {
				t.Fatalf("keys leaked into the error: %v", err)
			}
		})
	}
}

func TestStripeEmulatorValidateFlag(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	cmd := newStripeEmulatorCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--validate", "--faults", "http429=0.5,latency=5ms", "--addr", "127.0.0.1:0"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `faults="latency=5ms,http429=0.5"`) {
		t.Fatalf("output %q", out.String())
	}
	cmd = newStripeEmulatorCmd()
	cmd.SetArgs([]string{"--validate", "--faults", "nope=1"})
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	if err := cmd.Execute(); !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("want ErrInvalid, got %v", err)
	}
}

func TestStripeEmulatorServes(t *testing.T) {
	t.Parallel()
	c := emulatorConfig{Addr: "127.0.0.1:0", Customers: "cus_demo1,cus_demo2", Meters: "api_calls"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- runStripeEmulator(ctx, c, func(_ *stripeemulator.Emulator, a net.Addr) { ready <- a })
	}()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("emulator stopped: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("emulator not ready within 10 s")
	}
	base := "http://" + addr.String()
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(base), MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}})
	sc := &client.API{}
	sc.Init("sk_test_cmd", &stripe.Backends{API: b, Connect: b, Uploads: b})
	p := &stripe.BillingMeterEventParams{EventName: stripe.String("api_calls"), Identifier: stripe.String("k1"),
		Payload: map[string]string{"stripe_customer_id": "cus_demo1", "value": "3"}, Timestamp: stripe.Int64(time.Now().Unix())}
	p.SetIdempotencyKey("k1")
	if _, err := sc.BillingMeterEvents.New(p); err != nil {
		t.Fatal(err)
	}
	res, err := http.Get(base + "/_emulator/stats")
	if err != nil {
		t.Fatal(err)
	}
	var s stripeemulator.Stats
	err = json.NewDecoder(res.Body).Decode(&s)
	res.Body.Close()
	if err != nil || s.Applied != 1 || s.AppliedTotals["api_calls"] != 3 {
		t.Fatalf("stats %+v %v", s, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no shutdown within 10 s")
	}
}

// startEmulator runs runStripeEmulator with c until the test ends (or
// stop is called) and returns its base URL.
func startEmulator(t *testing.T, c emulatorConfig) (base string, stop func()) {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- runStripeEmulator(ctx, c, func(_ *stripeemulator.Emulator, a net.Addr) { ready <- a })
	}()
	select {
	case a := <-ready:
		base = "http://" + a.String()
	case err := <-done:
		cancel()
		t.Fatalf("emulator stopped: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("emulator not ready within 10 s")
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}
	t.Cleanup(stop)
	return base, stop
}

// The health check needs no key; with a state file, a restarted emulator
// keeps its meters (the --meters ones are not created twice) and
// customers, and still refuses an identifier it applied before.
func TestStripeEmulatorStateFileAndHealthz(t *testing.T) {
	t.Parallel()
	state := t.TempDir() + "/emulator-state.json"
	c := emulatorConfig{Addr: "127.0.0.1:0", Meters: "api_calls", StateFile: state}
	base, stop := startEmulator(t, c)
	res, err := http.Get(base + "/healthz")
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("/healthz without a key: %v %v", res, err)
	}
	res.Body.Close()
	sc := func(base string) *client.API {
		b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(base), MaxNetworkRetries: stripe.Int64(0),
			LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}})
		api := &client.API{}
		api.Init("sk_test_cmd", &stripe.Backends{API: b, Connect: b, Uploads: b})
		return api
	}
	api := sc(base)
	cus, err := api.Customers.New(&stripe.CustomerParams{Name: stripe.String("tenant")})
	if err != nil {
		t.Fatal(err)
	}
	send := func(api *client.API, key string) error {
		p := &stripe.BillingMeterEventParams{EventName: stripe.String("api_calls"), Identifier: stripe.String("id-1"),
			Payload: map[string]string{"stripe_customer_id": cus.ID, "value": "3"}, Timestamp: stripe.Int64(time.Now().Unix())}
		p.SetIdempotencyKey(key)
		_, err := api.BillingMeterEvents.New(p)
		return err
	}
	if err := send(api, "k1"); err != nil {
		t.Fatal(err)
	}
	var meters []string
	for it := api.BillingMeters.List(&stripe.BillingMeterListParams{}); it.Next(); {
		meters = append(meters, it.BillingMeter().ID)
	}
	stop()

	base2, _ := startEmulator(t, c)
	api2 := sc(base2)
	var after []string
	for it := api2.BillingMeters.List(&stripe.BillingMeterListParams{}); it.Next(); {
		after = append(after, it.BillingMeter().ID)
	}
	if len(meters) != 1 || strings.Join(after, ",") != strings.Join(meters, ",") {
		t.Fatalf("meters before %v, after the restart %v", meters, after)
	}
	if got, err := api2.Customers.Get(cus.ID, nil); err != nil || got.Name != "tenant" {
		t.Fatalf("customer after the restart: %v", err)
	}
	var se *stripe.Error
	if err := send(api2, "k2"); !errors.As(err, &se) || !strings.HasPrefix(se.Msg, stripeemulator.DuplicateIdentifierMessagePrefix) {
		t.Fatalf("id-1 after the restart: want the duplicate refusal, got %v", err)
	}
	res, err = http.Get(base2 + "/_emulator/stats")
	if err != nil {
		t.Fatal(err)
	}
	var s stripeemulator.Stats
	err = json.NewDecoder(res.Body).Decode(&s)
	res.Body.Close()
	if err != nil || s.Applied != 1 || s.AppliedTotals["api_calls"] != 3 || s.DuplicateApplications != 0 {
		t.Fatalf("stats after the restart %+v %v", s, err)
	}
}
