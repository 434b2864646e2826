// Package stripeexport sends outbox items to Stripe billing meter events
// with stripe-go v76 (billing/meterevent) and classifies every answer with
// one table (Rules). It implements deliverer.Exporter.
//
// Each call sends identifier = Idempotency-Key = the item's key, event_name
// from the meter mapping, payload {customer_key: customer, value_key: value}
// and timestamp = occurred_at (Unix seconds). The library's own retries are
// off (MaxNetworkRetries 0), so are net/http's transparent replays of
// idempotent requests and stripe-go's telemetry header, so a retry
// driven by the deliverer carries the same key and a byte-identical body.
// Nothing here logs: stripe-go's logger is silenced because its messages may
// carry Stripe's error text, which can name a customer.
package stripeexport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/aurora-billing/aurora/shared/field"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	stripe "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/billing/meterevent"
	"github.com/stripe/stripe-go/v76/billing/metereventadjustment"
)

// DefaultAPIBase is Stripe's API.
const DefaultAPIBase = "https://api.stripe.com"

// Config is the Stripe client's configuration.
type Config struct {
	// APIKey: sk_test_/rk_test_ (test mode) or sk_live_/rk_live_ (live mode).
	// AURORA_STRIPE_API_KEY, required. Never logged or printed.
	APIKey string `env:"STRIPE_API_KEY"`
	// APIBase: base URL, e.g. the emulator's http://127.0.0.1:12111.
	// AURORA_STRIPE_API_BASE, default https://api.stripe.com.
	APIBase string `env:"STRIPE_API_BASE" envDefault:"https://api.stripe.com"`
}

// KeyMode returns the mode of a Stripe secret or restricted key, or "" for
// a key of another shape.
func KeyMode(key string) identity.Mode {
	switch {
	case strings.HasPrefix(key, "sk_test_"), strings.HasPrefix(key, "rk_test_"):
		return identity.ModeTest
	case strings.HasPrefix(key, "sk_live_"), strings.HasPrefix(key, "rk_live_"):
		return identity.ModeLive
	default:
		return ""
	}
}

// Validate checks the key's shape and the base URL (errors are
// *config.RangeError; the key's value is never included).
func (c Config) Validate() error {
	var key error
	if KeyMode(c.APIKey) == "" {
		key = &config.RangeError{Var: config.Prefix + "STRIPE_API_KEY", Value: "(redacted)", Allowed: "a key starting sk_test_, rk_test_, sk_live_ or rk_live_"}
	}
	return errors.Join(key, config.URL("STRIPE_API_BASE", c.APIBase, "http", "https"))
}

// Exporter is the stripe-go meter event client. Safe for concurrent use.
type Exporter struct {
	client  meterevent.Client
	adjust  metereventadjustment.Client
	mode    identity.Mode
	rules   []Rule // Rules, built once
	cancels []Rule // CancelRules, built once
}

var (
	_ deliverer.Exporter  = (*Exporter)(nil)
	_ deliverer.Canceller = (*Exporter)(nil)
)

// New returns an Exporter for cfg. timeout is the HTTP client's timeout
// (seconds-scale; the deliverer's per-call deadline applies too);
// maxConns bounds idle keep-alive connections to Stripe (use the deliverer's
// concurrency). Errors: cfg.Validate's *config.RangeError.
func New(cfg Config, timeout time.Duration, maxConns int) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = max(100, maxConns)
	tr.MaxIdleConnsPerHost = max(2, maxConns)
	return newExporter(cfg, timeout, tr), nil
}

// newExporter is New over the transport tr (a test's fake Stripe).
func newExporter(cfg Config, timeout time.Duration, tr http.RoundTripper) *Exporter {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(strings.TrimRight(cfg.APIBase, "/")),
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		HTTPClient:        &http.Client{Timeout: timeout, Transport: observer{next: tr}},
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return &Exporter{client: meterevent.Client{B: backend, Key: cfg.APIKey}, adjust: metereventadjustment.Client{B: backend, Key: cfg.APIKey},
		mode: KeyMode(cfg.APIKey), rules: Rules(), cancels: CancelRules()}
}

// Name returns outbox.DefaultExporter.
func (e *Exporter) Name() string { return outbox.DefaultExporter }

// Mode returns the API key's mode.
func (e *Exporter) Mode() identity.Mode { return e.mode }

// Params returns the stripe-go parameters of r: a pure function of r, so
// every attempt encodes to the same body.
func Params(ctx context.Context, r deliverer.Request) *stripe.BillingMeterEventParams {
	p := &stripe.BillingMeterEventParams{
		EventName:  stripe.String(r.EventName),
		Identifier: stripe.String(r.Key),
		Payload: map[string]string{
			r.CustomerKey: r.Customer,
			r.ValueKey:    strconv.FormatInt(r.Value, 10),
		},
		Timestamp: stripe.Int64(r.Timestamp.Unix()),
	}
	p.Context = ctx
	p.SetIdempotencyKey(r.Key)
	return p
}

// Export sends r and classifies the answer with Rules.
func (e *Exporter) Export(ctx context.Context, r deliverer.Request) deliverer.Result {
	obs := &observation{}
	ev, err := e.client.New(Params(context.WithValue(ctx, observationKey{}, obs), r))
	a := answer(ctx, obs, err)
	if err == nil && ev != nil && ev.LastResponse != nil && a.RequestID == "" {
		a.RequestID = ev.LastResponse.RequestID
	}
	rules := e.rules
	if rules == nil { // an Exporter not made by New
		rules = Rules()
	}
	rule := classify(rules, a)
	res := deliverer.Result{
		Outcome: rule.Outcome, Reason: rule.Reason, Rule: rule.Name,
		HTTPStatus: a.Status, RequestID: a.RequestID, ErrorCode: a.Code, Message: a.Message,
	}
	if a.Status == 0 {
		res.ErrorCode = a.Transport
	}
	if rule.Outcome == deliverer.OutcomeAccepted {
		res.ProviderRef = r.Key
		if rule.Name == "http_2xx" && a.RequestID != "" {
			res.ProviderRef = a.RequestID
		}
	}
	return res
}

// answer turns a stripe-go return into an Answer. The HTTP status comes from
// the transport (observation), so a 5xx with a non-JSON body still counts
// as a 5xx.
func answer(ctx context.Context, obs *observation, err error) Answer {
	a := Answer{Status: obs.status, RequestID: obs.requestID}
	var se *stripe.Error
	switch {
	case err == nil:
	case errors.As(err, &se):
		a.Status = se.HTTPStatusCode
		a.Type, a.Code, a.Param, a.Message = string(se.Type), string(se.Code), se.Param, se.Msg
		if se.RequestID != "" {
			a.RequestID = se.RequestID
		}
	case a.Status != 0:
		a.Message = "unreadable answer" // e.g. an HTML 502; the body is not kept
	default:
		a.Transport = TransportConnection
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()) {
			a.Transport = TransportTimeout
		}
		a.Message = transportMessage(err)
	}
	for _, p := range []*string{&a.Type, &a.Code, &a.Param, &a.Message, &a.RequestID} {
		*p = storableText(*p)
	}
	return a
}

// MaxAnswerTextBytes bounds each text kept of an answer (type, code,
// param, message, Request-Id), in bytes.
const MaxAnswerTextBytes = 500

// storableText returns s as Postgres text can hold it: invalid UTF-8 and
// NUL become U+FFFD (a replacement, not a deletion, so no new code or
// message can appear), cut to MaxAnswerTextBytes on a character boundary.
// Stripe's answer is outside input: one NUL in a message (JSON \u0000)
// or a header failed the deliverer's whole outcome batch (found by
// FuzzAnswer).
func storableText(s string) string { return field.Storable(s, MaxAnswerTextBytes) }

// transportMessage keeps the error's kind but not URLs with parameters.
func transportMessage(err error) string {
	var op *net.OpError
	if errors.As(err, &op) {
		return fmt.Sprintf("%s: %v", op.Op, op.Err)
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

type observationKey struct{}

// observation is what the transport saw of the response.
type observation struct {
	status    int
	requestID string
}

// observer records the status and Request-Id of the response into the
// request context's observation.
type observer struct{ next http.RoundTripper }

func (o observer) RoundTrip(req *http.Request) (*http.Response, error) {
	// net/http silently replays a request that carries an Idempotency-Key
	// when a kept-alive connection closes before any answer (Request.
	// isReplayable). Without GetBody the request is not replayable: every
	// attempt is the deliverer's own, recorded in outbox_attempts.
	req = req.WithContext(req.Context())
	req.GetBody = nil
	resp, err := o.next.RoundTrip(req)
	if resp != nil {
		if obs, ok := req.Context().Value(observationKey{}).(*observation); ok {
			obs.status = resp.StatusCode
			obs.requestID = resp.Header.Get("Request-Id")
		}
	}
	return resp, err
}
