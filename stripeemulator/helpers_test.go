package stripeemulator_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/stripeemulator"
	stripe "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

const testKey = "sk_test_emulator_1234"

// epoch is the manual clock's start: a fixed instant, so tests never
// depend on the wall clock.
var epoch = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

// manualClock is a settable clock for Config.Now.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// env is one emulator behind an httptest server with a stripe-go client.
type env struct {
	t     *testing.T
	emu   *stripeemulator.Emulator
	srv   *httptest.Server
	sc    *client.API
	clock *manualClock
	meter stripeemulator.Meter
}

const (
	eventName = "api_calls"
	custA     = "cus_A"
	custB     = "cus_B"
)

// newEnv starts an emulator (manual clock at epoch unless cfg.Now is set)
// with customers cus_A, cus_B and a sum meter for "api_calls".
func newEnv(t *testing.T, cfg stripeemulator.Config) *env {
	t.Helper()
	clk := &manualClock{now: epoch}
	if cfg.Now == nil {
		cfg.Now = clk.Now
	}
	emu, err := stripeemulator.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(emu)
	t.Cleanup(srv.Close)
	for _, c := range []string{custA, custB} {
		if err := emu.AddCustomer(c); err != nil {
			t.Fatalf("AddCustomer: %v", err)
		}
	}
	m, err := emu.AddMeter(stripeemulator.MeterSpec{DisplayName: "API calls", EventName: eventName})
	if err != nil {
		t.Fatalf("AddMeter: %v", err)
	}
	return &env{t: t, emu: emu, srv: srv, sc: stripeClient(srv.URL, testKey, nil), clock: clk, meter: m}
}

// stripeClient is the real stripe-go v76 client against url, with its own
// retries off (as the deliverer uses it) and its logging silenced.
func stripeClient(u, key string, hc *http.Client) *client.API {
	cfg := &stripe.BackendConfig{
		URL:               stripe.String(u),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	}
	if hc != nil {
		cfg.HTTPClient = hc
	}
	b := stripe.GetBackendWithConfig(stripe.APIBackend, cfg)
	sc := &client.API{}
	sc.Init(key, &stripe.Backends{API: b, Connect: b, Uploads: b})
	return sc
}

// event builds meter event params with identifier as the Idempotency-Key too.
func event(identifier, customer, value string, ts time.Time) *stripe.BillingMeterEventParams {
	p := &stripe.BillingMeterEventParams{
		EventName:  stripe.String(eventName),
		Identifier: stripe.String(identifier),
		Payload:    map[string]string{"stripe_customer_id": customer, "value": value},
		Timestamp:  stripe.Int64(ts.Unix()),
	}
	p.SetIdempotencyKey(identifier)
	return p
}

// stripeErr unwraps a *stripe.Error or fails.
func stripeErr(t *testing.T, err error) *stripe.Error {
	t.Helper()
	var se *stripe.Error
	if !errors.As(err, &se) {
		t.Fatalf("want *stripe.Error, got %T %v", err, err)
	}
	return se
}

// rawResponse is a raw HTTP answer.
type rawResponse struct {
	status int
	header http.Header
	body   []byte
}

func (r rawResponse) errorObject(t *testing.T) map[string]any {
	t.Helper()
	var b struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(r.body, &b); err != nil || b.Error == nil {
		t.Fatalf("want a JSON error body, got %q (%v)", r.body, err)
	}
	return b.Error
}

// do sends a raw form request.
func (e *env) do(method, path string, form url.Values, header map[string]string) rawResponse {
	e.t.Helper()
	var body io.Reader
	target := e.srv.URL + path
	if method == http.MethodPost {
		body = strings.NewReader(form.Encode())
	} else if len(form) > 0 {
		target += "?" + form.Encode()
	}
	req, err := http.NewRequest(method, target, body)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+testKey)
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return rawResponse{status: res.StatusCode, header: res.Header, body: b}
}

// eventForm is a raw meter event form.
func eventForm(identifier, customer, value string, ts time.Time) url.Values {
	return url.Values{
		"event_name":                  {eventName},
		"identifier":                  {identifier},
		"payload[stripe_customer_id]": {customer},
		"payload[value]":              {value},
		"timestamp":                   {itoa(ts.Unix())},
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
