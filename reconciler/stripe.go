package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sethvargo/go-retry"
	stripe "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/billing/metereventsummary"
	"github.com/stripe/stripe-go/v76/invoice"
	"golang.org/x/time/rate"
)

// StripeProvider reads summaries, v2 events and invoices with stripe-go
// v76. Every HTTP request waits for the limiter (RequestsPerSecond), so a
// run stays inside Stripe's rate limits however many customers and meters
// it covers; a 429 is retried up to 5 times with jittered exponential
// backoff from 500 ms (the library's own retries are off). Nothing here
// logs: Stripe's error text can name a customer.
type StripeProvider struct {
	backend  stripe.Backend
	key      string
	limiter  *rate.Limiter
	requests atomic.Int64
}

// NewStripeProvider returns a provider for cfg pacing at rps requests per
// second. Errors: cfg.Validate's *config.RangeError.
func NewStripeProvider(cfg StripeConfig, rps int, timeout time.Duration) (*StripeProvider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rps < 1 {
		rps = 1
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(strings.TrimRight(cfg.APIBase, "/")),
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		HTTPClient:        &http.Client{Timeout: timeout},
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return &StripeProvider{backend: backend, key: cfg.APIKey, limiter: rate.NewLimiter(rate.Limit(rps), 1)}, nil
}

// Requests returns the number of HTTP requests made so far.
func (p *StripeProvider) Requests() int64 { return p.requests.Load() }

// call paces and retries one request.
func (p *StripeProvider) call(ctx context.Context, what string, fn func() error) error {
	b := retry.WithMaxRetries(5, retry.WithJitterPercent(20, retry.NewExponential(500*time.Millisecond)))
	err := retry.Do(ctx, b, func(ctx context.Context) error {
		if err := p.limiter.Wait(ctx); err != nil {
			return err
		}
		p.requests.Add(1)
		err := fn()
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusTooManyRequests {
			return retry.RetryableError(err)
		}
		return err
	})
	if err != nil {
		return &ProviderError{What: what, Class: errorClass(err), cause: err}
	}
	return nil
}

// ProviderError is a failed provider call: what was asked and the error's
// class (HTTP status, Stripe type and code, request id — never Stripe's
// message, which can name a customer). It wraps ErrProvider.
type ProviderError struct {
	What, Class string
	cause       error
}

func (e *ProviderError) Error() string {
	return "reconciler: provider call failed: " + e.What + ": " + e.Class
}

// Unwrap returns ErrProvider and the cause.
func (e *ProviderError) Unwrap() []error { return []error{ErrProvider, e.cause} }

// errorClass describes err without Stripe's message (which can carry a
// customer id).
func errorClass(err error) string {
	var se *stripe.Error
	if errors.As(err, &se) {
		return fmt.Sprintf("HTTP %d %s %s (request %s)", se.HTTPStatusCode, se.Type, se.Code, se.RequestID)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err.Error()
	}
	return "transport error"
}

// EventSummaries implements Provider, one page (≤ 100 summaries) per paced
// request.
func (p *StripeProvider) EventSummaries(ctx context.Context, meterID, customer string, start, end time.Time, hourly bool) ([]Summary, error) {
	c := metereventsummary.Client{B: p.backend, Key: p.key}
	var out []Summary
	var after *string
	for {
		params := &stripe.BillingMeterEventSummaryListParams{
			ID: stripe.String(meterID), Customer: stripe.String(customer),
			StartTime: stripe.Int64(start.Unix()), EndTime: stripe.Int64(end.Unix()),
		}
		if hourly {
			params.ValueGroupingWindow = stripe.String("hour")
		}
		params.Context = ctx
		params.Single = true
		params.Limit = stripe.Int64(100)
		params.StartingAfter = after
		var page []*stripe.BillingMeterEventSummary
		more := false
		err := p.call(ctx, "event_summaries", func() error {
			page, more = nil, false
			it := c.List(params)
			for it.Next() {
				page = append(page, it.BillingMeterEventSummary())
			}
			if it.Err() != nil {
				return it.Err()
			}
			more = it.Meta().HasMore
			return nil
		})
		if err != nil {
			var se *stripe.Error
			if errors.As(err, &se) && se.Code == stripe.ErrorCodeResourceMissing && se.Param == "customer" {
				return nil, fmt.Errorf("%w: %w", ErrUnknownCustomer, err)
			}
			return nil, err
		}
		for _, s := range page {
			out = append(out, Summary{Start: time.Unix(s.StartTime, 0).UTC(), End: time.Unix(s.EndTime, 0).UTC(), Value: s.AggregatedValue})
		}
		if !more || len(page) == 0 {
			return out, nil
		}
		after = stripe.String(page[len(page)-1].ID)
	}
}

// coreEventJSON is a v2 event as /v2/core/events/{id} answers it.
type coreEventJSON struct {
	stripe.APIResource
	ID            string               `json:"id"`
	Object        string               `json:"object"`
	Type          string               `json:"type"`
	Created       time.Time            `json:"created"`
	RelatedObject *struct{ ID string } `json:"related_object"`
	Data          json.RawMessage      `json:"data"`
}

// CoreEvent implements Provider.
func (p *StripeProvider) CoreEvent(ctx context.Context, id string) (CoreEvent, error) {
	var v coreEventJSON
	err := p.call(ctx, "v2 core event", func() error {
		return p.backend.Call(http.MethodGet, "/v2/core/events/"+id, p.key, &stripe.Params{Context: ctx}, &v)
	})
	if err != nil {
		return CoreEvent{}, err
	}
	ev := CoreEvent{ID: v.ID, Type: v.Type, Created: v.Created.UTC(), Raw: v.Data}
	if v.RelatedObject != nil {
		ev.MeterID = v.RelatedObject.ID
	}
	if len(v.Data) > 0 {
		if err := json.Unmarshal(v.Data, &ev.Data); err != nil {
			return CoreEvent{}, fmt.Errorf("%w: v2 core event %s: data is not a meter error report", ErrProvider, id)
		}
	}
	return ev, nil
}

// FinalizedInvoices implements Provider: invoices created since (the
// earliest period the run covers) whose status is open, paid or
// uncollectible, with their metered subscription lines.
func (p *StripeProvider) FinalizedInvoices(ctx context.Context, customer string, since time.Time) ([]Invoice, error) {
	c := invoice.Client{B: p.backend, Key: p.key}
	var out []Invoice
	var after *string
	for {
		params := &stripe.InvoiceListParams{Customer: stripe.String(customer), CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: since.Unix()}}
		params.Context = ctx
		params.Single = true
		params.Limit = stripe.Int64(100)
		params.StartingAfter = after
		var page []*stripe.Invoice
		more := false
		err := p.call(ctx, "invoices", func() error {
			page, more = nil, false
			it := c.List(params)
			for it.Next() {
				page = append(page, it.Invoice())
			}
			if it.Err() != nil {
				return it.Err()
			}
			more = it.Meta().HasMore
			return nil
		})
		var se *stripe.Error
		if errors.As(err, &se) && se.Code == stripe.ErrorCodeResourceMissing && se.Param == "customer" {
			return nil, nil // a customer Stripe does not know has no invoices
		}
		if err != nil {
			return nil, err
		}
		for _, inv := range page {
			switch inv.Status {
			case stripe.InvoiceStatusOpen, stripe.InvoiceStatusPaid, stripe.InvoiceStatusUncollectible:
			default:
				continue
			}
			if inv.StatusTransitions == nil || inv.StatusTransitions.FinalizedAt == 0 {
				continue
			}
			out = append(out, invoiceOf(inv, customer))
		}
		if !more || len(page) == 0 {
			return out, nil
		}
		after = stripe.String(page[len(page)-1].ID)
	}
}

func invoiceOf(inv *stripe.Invoice, customer string) Invoice {
	v := Invoice{ID: inv.ID, Customer: customer, FinalizedAt: time.Unix(inv.StatusTransitions.FinalizedAt, 0).UTC()}
	if inv.Lines == nil {
		return v
	}
	for _, l := range inv.Lines.Data {
		if l == nil || l.Price == nil || l.Price.Recurring == nil || l.Price.Recurring.Meter == "" || l.Period == nil {
			continue
		}
		if l.Price.Recurring.UsageType != "" && l.Price.Recurring.UsageType != stripe.PriceRecurringUsageTypeMetered {
			continue
		}
		v.Lines = append(v.Lines, InvoiceLine{ID: l.ID, PriceID: l.Price.ID, MeterID: l.Price.Recurring.Meter, Quantity: l.Quantity,
			PeriodStart: time.Unix(l.Period.Start, 0).UTC(), PeriodEnd: time.Unix(l.Period.End, 0).UTC()})
	}
	return v
}
