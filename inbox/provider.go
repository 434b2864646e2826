package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	stripe "github.com/stripe/stripe-go/v76"
	stripeinvoice "github.com/stripe/stripe-go/v76/invoice"
	stripesubscription "github.com/stripe/stripe-go/v76/subscription"
)

// ProviderTimeoutDefault bounds one provider request.
const ProviderTimeoutDefault = 30 * time.Second

// StripeProvider reads current subscriptions and invoices with stripe-go
// v76 (library retries off: an operator runs the command again). It is used
// by the operator's resolution only, never on the webhook path. Nothing
// here logs: Stripe's error text can name a customer.
type StripeProvider struct {
	backend stripe.Backend
	key     string
}

// NewStripeProvider returns a provider for key at apiBase ("" = Stripe's
// own API), each request bounded by timeout (≤ 0: ProviderTimeoutDefault).
func NewStripeProvider(key, apiBase string, timeout time.Duration) *StripeProvider {
	if timeout <= 0 {
		timeout = ProviderTimeoutDefault
	}
	cfg := &stripe.BackendConfig{
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		HTTPClient:        &http.Client{Timeout: timeout},
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	}
	if apiBase != "" {
		cfg.URL = stripe.String(strings.TrimRight(apiBase, "/"))
	}
	return &StripeProvider{backend: stripe.GetBackendWithConfig(stripe.APIBackend, cfg), key: key}
}

// Subscription implements Provider: GET /v1/subscriptions/{id}.
func (p *StripeProvider) Subscription(ctx context.Context, id string) (json.RawMessage, error) {
	params := &stripe.SubscriptionParams{}
	params.Context = ctx
	s, err := stripesubscription.Client{B: p.backend, Key: p.key}.Get(id, params)
	if err != nil {
		return nil, &ProviderError{What: "subscription " + id, Class: providerErrorClass(err), cause: err}
	}
	return rawOf(s.LastResponse, "subscription "+id)
}

// Invoice implements Provider: GET /v1/invoices/{id}.
func (p *StripeProvider) Invoice(ctx context.Context, id string) (json.RawMessage, error) {
	params := &stripe.InvoiceParams{}
	params.Context = ctx
	inv, err := stripeinvoice.Client{B: p.backend, Key: p.key}.Get(id, params)
	if err != nil {
		return nil, &ProviderError{What: "invoice " + id, Class: providerErrorClass(err), cause: err}
	}
	return rawOf(inv.LastResponse, "invoice "+id)
}

func rawOf(r *stripe.APIResponse, what string) (json.RawMessage, error) {
	if r == nil || !json.Valid(r.RawJSON) {
		return nil, &ProviderError{What: what, Class: "unreadable response", cause: errors.New("no JSON body")}
	}
	return json.RawMessage(r.RawJSON), nil
}

// ProviderError is a failed provider call: what was asked and the error's
// class (HTTP status, Stripe type and code, request id — never Stripe's
// message, which can name a customer). It wraps ErrProvider.
type ProviderError struct {
	What, Class string
	cause       error
}

func (e *ProviderError) Error() string {
	return "inbox: provider call failed: " + e.What + ": " + e.Class
}

// Unwrap returns ErrProvider and the cause.
func (e *ProviderError) Unwrap() []error { return []error{ErrProvider, e.cause} }

// NotFound reports whether the provider answered 404 (no such object).
func (e *ProviderError) NotFound() bool {
	var se *stripe.Error
	return errors.As(e.cause, &se) && se.HTTPStatusCode == http.StatusNotFound
}

func providerErrorClass(err error) string {
	var se *stripe.Error
	if errors.As(err, &se) {
		return fmt.Sprintf("HTTP %d %s %s (request %s)", se.HTTPStatusCode, se.Type, se.Code, se.RequestID)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err.Error()
	}
	return "transport error"
}
