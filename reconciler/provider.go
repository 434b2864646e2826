package reconciler

import (
	"context"
	"encoding/json"
	"time"
)

// Provider is what the reconciler reads from Stripe. StripeProvider is the
// implementation; every call is paced by the caller's limiter.
type Provider interface {
	// EventSummaries returns meter meterID's summaries for customer over
	// [start, end) (start inclusive, end exclusive, Unix seconds at Stripe),
	// one per hour when hourly is true (start and end hour aligned),
	// otherwise one for the whole range (minute aligned), every page
	// followed. Errors wrap ErrProvider.
	EventSummaries(ctx context.Context, meterID, customer string, start, end time.Time, hourly bool) ([]Summary, error)
	// CoreEvent fetches a thin event's full body (GET /v2/core/events/{id}).
	// Errors wrap ErrProvider.
	CoreEvent(ctx context.Context, id string) (CoreEvent, error)
	// FinalizedInvoices returns customer's invoices finalized at or after
	// since (status open, paid or uncollectible), with their metered lines.
	// Errors wrap ErrProvider.
	FinalizedInvoices(ctx context.Context, customer string, since time.Time) ([]Invoice, error)
}

// Summary is one meter event summary: Value aggregated over [Start, End).
type Summary struct {
	Start, End time.Time
	Value      float64
}

// CoreEvent is a v2 event fetched from /v2/core/events/{id}: a meter error
// report's full body.
type CoreEvent struct {
	ID      string    `json:"id"`
	Type    string    `json:"type"`
	Created time.Time `json:"created"`
	// MeterID is related_object.id ("" for v1.billing.meter.no_meter_found).
	MeterID string          `json:"meter_id"`
	Data    ErrorReportData `json:"data"`
	// Raw is the event's data object as received.
	Raw json.RawMessage `json:"-"`
}

// ErrorReportData is a meter error report's data (FACTS: validation_start,
// validation_end, developer_message_summary, reason.error_count,
// reason.error_types[].{code, error_count, sample_errors[].{error_message,
// request.identifier}}).
type ErrorReportData struct {
	ValidationStart         time.Time `json:"validation_start"`
	ValidationEnd           time.Time `json:"validation_end"`
	DeveloperMessageSummary string    `json:"developer_message_summary"`
	Reason                  struct {
		ErrorCount int64 `json:"error_count"`
		ErrorTypes []struct {
			Code         string `json:"code"`
			ErrorCount   int64  `json:"error_count"`
			SampleErrors []struct {
				ErrorMessage string `json:"error_message"`
				Request      struct {
					Identifier string `json:"identifier"`
				} `json:"request"`
			} `json:"sample_errors"`
		} `json:"error_types"`
	} `json:"reason"`
}

// Invoice is a finalized invoice with its metered lines.
type Invoice struct {
	ID          string
	Customer    string
	FinalizedAt time.Time
	Lines       []InvoiceLine
}

// InvoiceLine is a metered line item: Quantity of PriceID (whose meter is
// MeterID) over [PeriodStart, PeriodEnd).
type InvoiceLine struct {
	ID                     string
	PriceID, MeterID       string
	Quantity               int64
	PeriodStart, PeriodEnd time.Time
}

// MeterErrorEventTypes are the thin event types that carry meter error
// reports (FACTS: v2.billing.meter.error_report_triggered does not exist).
var MeterErrorEventTypes = []string{"v1.billing.meter.error_report_triggered", "v1.billing.meter.no_meter_found"}
