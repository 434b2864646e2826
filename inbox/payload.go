package inbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/aurora-billing/aurora/shared/field"
)

// ErrUnrecognizedPayload is wrapped by every *PayloadError.
var ErrUnrecognizedPayload = errors.New("inbox: unrecognized stripe payload")

// PayloadError names the field of a stored event that could not be used.
// Its Field never carries payload values.
type PayloadError struct {
	Field  string // JSON path, e.g. "data.object.customer"
	Reason string // what is wrong, e.g. "missing", "not a string"
	// Code is the reason the event is quarantined with;
	// "" means ReasonUnrecognizedStripePayload.
	Code Reason
}

// quarantineReason is the reason an event whose body failed to parse with
// err is quarantined with.
func quarantineReason(err error) Reason {
	var pe *PayloadError
	if errors.As(err, &pe) && pe.Code != "" {
		return pe.Code
	}
	return ReasonUnrecognizedStripePayload
}

func (e *PayloadError) Error() string {
	return fmt.Sprintf("inbox: unrecognized stripe payload: %s %s", e.Field, e.Reason)
}

// Unwrap returns ErrUnrecognizedPayload.
func (e *PayloadError) Unwrap() error { return ErrUnrecognizedPayload }

// Event kinds the worker projects.
type kind int

const (
	kindOther        kind = iota // recorded as processed, no projection
	kindCheckout                 // checkout.session.completed
	kindSubscription             // customer.subscription.*
	kindInvoice                  // invoice.paid, invoice.payment_succeeded, invoice.payment_failed
)

// Invoice outcomes.
const (
	invoicePaid   = "paid"
	invoiceFailed = "failed"
)

// MetadataTenantKey is the checkout metadata key that names the tenant when
// client_reference_id is empty.
const MetadataTenantKey = "aurora_tenant"

// event is a Stripe event envelope with the fields the inbox uses, read from
// the raw body (independent of api_version).
type event struct {
	ID         string
	Type       string
	APIVersion string
	Created    time.Time // second precision, UTC
	Livemode   bool
	Kind       kind
	Customer   string // Stripe customer of data.object; "" when none

	Checkout     *checkoutObject
	Subscription *subscriptionObject
	Invoice      *invoiceObject
}

type checkoutObject struct {
	ID             string
	Mode           string
	Tenant         string // from client_reference_id or metadata; "" when neither
	SubscriptionID string
}

type subscriptionObject struct {
	ID                string
	Status            string
	PriceIDs          []string // items.data[].price.id (or plan.id)
	CurrentPeriodEnd  *time.Time
	CancelAtPeriodEnd bool
}

type invoiceObject struct {
	ID             string
	Outcome        string // invoicePaid | invoiceFailed
	SubscriptionID string // "" when the invoice names no source
	// Amount: amount_paid (paid) or amount_due (failed) in the currency's
	// minor unit; nil when the object has no such field. Present but not a
	// non-negative integer (negative, a string, null, a fraction, beyond
	// int64) refuses the event with ReasonInvalidInvoiceAmount rather than
	// announcing the outcome without its amount.
	Amount   *int64
	Currency string // lowercase ISO code; "" when absent or malformed
}

// envelopeJSON is the part of the envelope read at ingest and by the worker.
type envelopeJSON struct {
	ID         *string          `json:"id"`
	Object     *string          `json:"object"`
	Type       *string          `json:"type"`
	APIVersion *string          `json:"api_version"`
	Created    json.RawMessage  `json:"created"` // Unix seconds, or RFC 3339 in a thin event (ObjectThinEvent)
	Livemode   bool             `json:"livemode"`
	Data       *json.RawMessage `json:"data"`
}

// parseEvent reads a stored raw body. Every problem is a *PayloadError.
func parseEvent(raw []byte) (*event, error) {
	var env envelopeJSON
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, &PayloadError{Field: "$", Reason: "is not a JSON event envelope"}
	}
	if env.ID == nil || *env.ID == "" {
		return nil, &PayloadError{Field: "id", Reason: "missing"}
	}
	if env.Object != nil && *env.Object != "event" && *env.Object != ObjectThinEvent {
		return nil, &PayloadError{Field: "object", Reason: "is not \"event\" or \"" + ObjectThinEvent + "\""}
	}
	if env.Type == nil || *env.Type == "" {
		return nil, &PayloadError{Field: "type", Reason: "missing"}
	}
	created, ok := eventCreated(env.Created)
	if !ok {
		return nil, &PayloadError{Field: "created", Reason: "missing or not a positive Unix time or RFC 3339 time"}
	}
	ev := &event{ID: *env.ID, Type: *env.Type, Created: created, Livemode: env.Livemode}
	if env.Object != nil && *env.Object == ObjectThinEvent {
		ev.Kind = kindOther // a thin event carries no object to project
		return ev, nil
	}
	if env.APIVersion != nil {
		ev.APIVersion = *env.APIVersion
	}
	ev.Kind = kindOf(ev.Type)
	if ev.Kind == kindOther {
		// still read the customer if there is one, for the advisory lock
		ev.Customer = customerOf(env.Data)
		return ev, nil
	}
	if env.Data == nil {
		return nil, &PayloadError{Field: "data", Reason: "missing"}
	}
	var data struct {
		Object json.RawMessage `json:"object"`
	}
	if err := json.Unmarshal(*env.Data, &data); err != nil || len(data.Object) == 0 || data.Object[0] != '{' {
		return nil, &PayloadError{Field: "data.object", Reason: "missing or not an object"}
	}
	var err error
	switch ev.Kind {
	case kindCheckout:
		err = parseCheckout(ev, data.Object)
	case kindSubscription:
		err = parseSubscription(ev, data.Object)
	case kindInvoice:
		err = parseInvoice(ev, data.Object)
	case kindOther:
	}
	if err != nil {
		return nil, err
	}
	return ev, nil
}

func kindOf(t string) kind {
	switch {
	case t == "checkout.session.completed":
		return kindCheckout
	case strings.HasPrefix(t, "customer.subscription."):
		return kindSubscription
	case t == "invoice.paid", t == "invoice.payment_succeeded", t == "invoice.payment_failed":
		return kindInvoice
	default:
		return kindOther
	}
}

// customerOf returns data.object.customer of an envelope's data, or "".
func customerOf(data *json.RawMessage) string {
	if data == nil {
		return ""
	}
	var d struct {
		Object struct {
			Customer json.RawMessage `json:"customer"`
		} `json:"object"`
	}
	if json.Unmarshal(*data, &d) != nil {
		return ""
	}
	id, _ := expandableID(d.Object.Customer)
	return id
}

// expandableID reads a Stripe expandable reference (referenceID) and
// refuses (ok false) an id aurora could not store (field.OptionalText with
// field.MaxStripeIDBytes: NUL or another control character, invalid UTF-8,
// over 255 bytes): such an id would fail the projection's SQL (Postgres
// text refuses NUL) and be retried to a dead letter, where it is a payload
// to refuse at once.
func expandableID(raw json.RawMessage) (id string, ok bool) {
	id, ok = referenceID(raw)
	if !ok || field.OptionalText(id, field.MaxStripeIDBytes) != "" {
		return "", false
	}
	return id, true
}

// referenceID reads a Stripe expandable reference as sent: a string id, an
// expanded object with "id", or null/absent (""). ok is false for any other
// shape. The webhook handler reads the customer with it and answers an
// unstorable one 422 itself (nothing stored).
func referenceID(raw json.RawMessage) (id string, ok bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", true
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	case '{':
		var o struct {
			ID *string `json:"id"`
		}
		if json.Unmarshal(raw, &o) != nil || o.ID == nil {
			return "", false
		}
		return *o.ID, true
	default:
		return "", false
	}
}

func requiredID(raw json.RawMessage, field string) (string, error) {
	id, ok := expandableID(raw)
	if !ok {
		return "", &PayloadError{Field: field, Reason: "is not an id or an expanded object"}
	}
	if id == "" {
		return "", &PayloadError{Field: field, Reason: "missing"}
	}
	return id, nil
}

// validTenant: non-empty, at most 255 bytes, no control characters or
// surrounding spaces.
func validTenant(s string) bool {
	if s == "" || len(s) > 255 || strings.TrimSpace(s) != s {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return false
		}
	}
	return true
}

func parseCheckout(ev *event, obj json.RawMessage) error {
	var o struct {
		ID                json.RawMessage            `json:"id"`
		Customer          json.RawMessage            `json:"customer"`
		ClientReferenceID json.RawMessage            `json:"client_reference_id"`
		Metadata          map[string]json.RawMessage `json:"metadata"`
		Mode              *string                    `json:"mode"`
		Subscription      json.RawMessage            `json:"subscription"`
	}
	if err := json.Unmarshal(obj, &o); err != nil {
		return &PayloadError{Field: "data.object", Reason: "is not a checkout session"}
	}
	id, err := requiredID(o.ID, "data.object.id")
	if err != nil {
		return err
	}
	cus, ok := expandableID(o.Customer)
	if !ok {
		return &PayloadError{Field: "data.object.customer", Reason: "is not an id or an expanded object"}
	}
	sub, ok := expandableID(o.Subscription)
	if !ok {
		return &PayloadError{Field: "data.object.subscription", Reason: "is not an id or an expanded object"}
	}
	ref, err := optionalString(o.ClientReferenceID, "data.object.client_reference_id")
	if err != nil {
		return err
	}
	var meta string
	if raw, present := o.Metadata[MetadataTenantKey]; present {
		if meta, err = optionalString(raw, "data.object.metadata."+MetadataTenantKey); err != nil {
			return err
		}
		if meta == "" {
			return &PayloadError{Field: "data.object.metadata." + MetadataTenantKey, Reason: "is empty"}
		}
	}
	if ref != "" && !validTenant(ref) {
		return &PayloadError{Field: "data.object.client_reference_id", Reason: "is not a valid tenant"}
	}
	if meta != "" && !validTenant(meta) {
		return &PayloadError{Field: "data.object.metadata." + MetadataTenantKey, Reason: "is not a valid tenant"}
	}
	if ref != "" && meta != "" && ref != meta {
		return &PayloadError{Field: "data.object.client_reference_id", Reason: "contradicts metadata." + MetadataTenantKey}
	}
	tenant := ref
	if tenant == "" {
		tenant = meta
	}
	mode := ""
	if o.Mode != nil {
		mode = *o.Mode
	}
	ev.Customer = cus
	ev.Checkout = &checkoutObject{ID: id, Mode: mode, Tenant: tenant, SubscriptionID: sub}
	return nil
}

func optionalString(raw json.RawMessage, field string) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", &PayloadError{Field: field, Reason: "is not a string"}
	}
	return s, nil
}

// Subscription statuses after which a subscription no longer competes
// (Stripe: canceled and incomplete_expired are terminal).
func terminalSubscriptionStatus(s string) bool {
	return s == "canceled" || s == "incomplete_expired"
}

// entitledSubscriptionStatus: the statuses under which the subscription's
// plan is granted.
func entitledSubscriptionStatus(s string) bool {
	return s == "active" || s == "trialing" || s == "past_due"
}

var subscriptionStatuses = map[string]bool{
	"incomplete": true, "incomplete_expired": true, "trialing": true, "active": true,
	"past_due": true, "canceled": true, "unpaid": true, "paused": true,
}

func parseSubscription(ev *event, obj json.RawMessage) error {
	var o struct {
		ID                json.RawMessage `json:"id"`
		Customer          json.RawMessage `json:"customer"`
		Status            *string         `json:"status"`
		CurrentPeriodEnd  *int64          `json:"current_period_end"`
		CancelAtPeriodEnd bool            `json:"cancel_at_period_end"`
		Items             *struct {
			Data []struct {
				Price            json.RawMessage `json:"price"`
				Plan             json.RawMessage `json:"plan"`
				CurrentPeriodEnd *int64          `json:"current_period_end"`
			} `json:"data"`
		} `json:"items"`
	}
	if err := json.Unmarshal(obj, &o); err != nil {
		return &PayloadError{Field: "data.object", Reason: "is not a subscription"}
	}
	id, err := requiredID(o.ID, "data.object.id")
	if err != nil {
		return err
	}
	cus, err := requiredID(o.Customer, "data.object.customer")
	if err != nil {
		return err
	}
	if o.Status == nil || !subscriptionStatuses[*o.Status] {
		return &PayloadError{Field: "data.object.status", Reason: "missing or not a subscription status"}
	}
	s := &subscriptionObject{ID: id, Status: *o.Status, CancelAtPeriodEnd: o.CancelAtPeriodEnd}
	end := o.CurrentPeriodEnd
	if o.Items != nil {
		for i, it := range o.Items.Data {
			price, ok := expandableID(it.Price)
			if !ok {
				return &PayloadError{Field: fmt.Sprintf("data.object.items.data[%d].price", i), Reason: "is not an id or an expanded object"}
			}
			if price == "" {
				if price, ok = expandableID(it.Plan); !ok || price == "" {
					return &PayloadError{Field: fmt.Sprintf("data.object.items.data[%d].price", i), Reason: "missing"}
				}
			}
			s.PriceIDs = append(s.PriceIDs, price)
			if end == nil && it.CurrentPeriodEnd != nil { // basil: period on the item
				end = it.CurrentPeriodEnd
			}
		}
	}
	if end != nil && *end > 0 {
		t := time.Unix(*end, 0).UTC()
		s.CurrentPeriodEnd = &t
	}
	ev.Customer = cus
	ev.Subscription = s
	return nil
}

func parseInvoice(ev *event, obj json.RawMessage) error {
	var o struct {
		ID           json.RawMessage `json:"id"`
		Customer     json.RawMessage `json:"customer"`
		Subscription json.RawMessage `json:"subscription"`
		AmountPaid   json.RawMessage `json:"amount_paid"`
		AmountDue    json.RawMessage `json:"amount_due"`
		Currency     json.RawMessage `json:"currency"`
		Parent       *struct {
			SubscriptionDetails *struct {
				Subscription json.RawMessage `json:"subscription"`
			} `json:"subscription_details"`
		} `json:"parent"`
	}
	if err := json.Unmarshal(obj, &o); err != nil {
		return &PayloadError{Field: "data.object", Reason: "is not an invoice"}
	}
	id, err := requiredID(o.ID, "data.object.id")
	if err != nil {
		return err
	}
	cus, err := requiredID(o.Customer, "data.object.customer")
	if err != nil {
		return err
	}
	legacy, ok := expandableID(o.Subscription)
	if !ok {
		return &PayloadError{Field: "data.object.subscription", Reason: "is not an id or an expanded object"}
	}
	var parent string
	if o.Parent != nil && o.Parent.SubscriptionDetails != nil {
		if parent, ok = expandableID(o.Parent.SubscriptionDetails.Subscription); !ok {
			return &PayloadError{Field: "data.object.parent.subscription_details.subscription", Reason: "is not an id or an expanded object"}
		}
	}
	if legacy != "" && parent != "" && legacy != parent {
		return &PayloadError{Field: "data.object.subscription", Reason: "contradicts parent.subscription_details.subscription"}
	}
	src := legacy
	if src == "" {
		src = parent
	}
	outcome := invoicePaid
	if ev.Type == "invoice.payment_failed" {
		outcome = invoiceFailed
	}
	ev.Customer = cus
	amount, field := o.AmountPaid, "data.object.amount_paid"
	if outcome == invoiceFailed {
		amount, field = o.AmountDue, "data.object.amount_due"
	}
	n, err := minorAmount(amount, field)
	if err != nil {
		return err
	}
	cur, err := currencyCode(o.Currency, "data.object.currency")
	if err != nil {
		return err
	}
	ev.Invoice = &invoiceObject{ID: id, Outcome: outcome, SubscriptionID: src, Amount: n, Currency: cur}
	return nil
}

// minorAmount reads the amount at field (a JSON path, for the error): nil
// when raw is absent (len 0), a non-negative int64 when it is a JSON
// integer in range, else a *PayloadError with Code
// ReasonInvalidInvoiceAmount naming field (never the value).
func minorAmount(raw json.RawMessage, field string) (*int64, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var n int64
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) || json.Unmarshal(raw, &n) != nil || n < 0 {
		return nil, &PayloadError{Field: field, Reason: "is not a non-negative integer amount in the currency's minor unit", Code: ReasonInvalidInvoiceAmount}
	}
	return &n, nil
}

// currencyCode reads the invoice's currency at field (a JSON path, for the
// error): "" when raw is absent (len 0), the ISO 4217 code in lowercase when
// it is a JSON string of three ASCII letters (Stripe sends lowercase; an
// uppercase code is the same currency), else a *PayloadError with Code
// ReasonInvalidInvoiceAmount naming field (never the value): an amount in
// minor units means nothing without its currency, so an announcement never
// goes out with a currency that was present and unreadable.
func currencyCode(raw json.RawMessage, field string) (string, error) {
	if len(raw) == 0 {
		return "", nil
	}
	bad := &PayloadError{Field: field, Reason: "is not a three-letter ISO 4217 currency code", Code: ReasonInvalidInvoiceAmount}
	var c string
	if json.Unmarshal(raw, &c) != nil || len(c) != 3 {
		return "", bad
	}
	b := []byte(c)
	for i, ch := range b {
		switch {
		case ch >= 'a' && ch <= 'z':
		case ch >= 'A' && ch <= 'Z':
			b[i] = ch + ('a' - 'A')
		default:
			return "", bad
		}
	}
	return string(b), nil
}
