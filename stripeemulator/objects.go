package stripeemulator

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Subscriptions and invoices as the emulator was told they are: what an
// operator's `auroractl inbox resolve --from-provider` reads back as
// Stripe's current state. The emulator does not bill them; a test (or the
// control endpoints) sets each object's state and GET answers it in
// Stripe's shape (API 2023-10-16, stripe-go v76).
//
//	GET  /v1/subscriptions/{id}   the told subscription, or 404 resource_missing
//	GET  /v1/invoices/{id}        the told invoice (else a metered subscription's), or 404
//	POST /_emulator/subscriptions id, customer, status, price (repeatable),
//	                              current_period_end (Unix s), cancel_at_period_end
//	POST /_emulator/invoices      id, customer, subscription, status, attempted

// Routes of the told objects.
const (
	RouteSubscriptionGet Route = "GET /v1/subscriptions/{id}"
	RouteInvoiceGet      Route = "GET /v1/invoices/{id}"
)

// ErrInvalidObject: a subscription or invoice state that Stripe could not
// have (missing id, unknown status, …).
var ErrInvalidObject = errors.New("stripeemulator: invalid object")

// subscriptionStatuses are Stripe's subscription statuses.
var subscriptionStatuses = []string{"incomplete", "incomplete_expired", "trialing", "active", "past_due", "canceled", "unpaid", "paused"}

// invoiceStatuses are Stripe's invoice statuses.
var invoiceStatuses = []string{"draft", "open", "paid", "uncollectible", "void"}

// SubscriptionState is a subscription as Stripe would answer it now.
type SubscriptionState struct {
	ID                string    // sub_…
	Customer          string    // cus_…
	Status            string    // one of Stripe's subscription statuses
	PriceIDs          []string  // one subscription item per price, in order
	CurrentPeriodEnd  time.Time // zero: answered as 0
	CancelAtPeriodEnd bool
}

// InvoiceState is an invoice as Stripe would answer it now.
type InvoiceState struct {
	ID           string // in_…
	Customer     string // cus_…
	Subscription string // sub_…; "" for an invoice without one
	Status       string // draft, open, paid, uncollectible, void
	// Attempted: a payment was attempted (Stripe's `attempted`); an open
	// invoice with an attempt is one whose payment failed.
	Attempted bool
}

func (s SubscriptionState) validate() error {
	switch {
	case !strings.HasPrefix(s.ID, "sub_"):
		return fmt.Errorf("%w: subscription id must start with sub_", ErrInvalidObject)
	case s.Customer == "":
		return fmt.Errorf("%w: subscription customer is required", ErrInvalidObject)
	case !slices.Contains(subscriptionStatuses, s.Status):
		return fmt.Errorf("%w: subscription status must be one of %s", ErrInvalidObject, strings.Join(subscriptionStatuses, ", "))
	}
	for _, p := range s.PriceIDs {
		if !strings.HasPrefix(p, "price_") {
			return fmt.Errorf("%w: price ids must start with price_", ErrInvalidObject)
		}
	}
	return nil
}

func (s InvoiceState) validate() error {
	switch {
	case !strings.HasPrefix(s.ID, "in_"):
		return fmt.Errorf("%w: invoice id must start with in_", ErrInvalidObject)
	case s.Customer == "":
		return fmt.Errorf("%w: invoice customer is required", ErrInvalidObject)
	case s.Subscription != "" && !strings.HasPrefix(s.Subscription, "sub_"):
		return fmt.Errorf("%w: invoice subscription must start with sub_", ErrInvalidObject)
	case !slices.Contains(invoiceStatuses, s.Status):
		return fmt.Errorf("%w: invoice status must be one of %s", ErrInvalidObject, strings.Join(invoiceStatuses, ", "))
	}
	return nil
}

// told is the emulator's told objects (under e.mu).
type told struct {
	subs     map[string]SubscriptionState
	invoices map[string]InvoiceState
}

// SetSubscription sets (or replaces) what GET /v1/subscriptions/{id}
// answers for s.ID. Errors wrap ErrInvalidObject.
func (e *Emulator) SetSubscription(s SubscriptionState) error {
	if err := s.validate(); err != nil {
		return err
	}
	s.PriceIDs = slices.Clone(s.PriceIDs)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.told.subs == nil {
		e.told.subs = map[string]SubscriptionState{}
	}
	e.told.subs[s.ID] = s
	return nil
}

// SetInvoice sets (or replaces) what GET /v1/invoices/{id} answers for
// s.ID. Errors wrap ErrInvalidObject.
func (e *Emulator) SetInvoice(s InvoiceState) error {
	if err := s.validate(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.told.invoices == nil {
		e.told.invoices = map[string]InvoiceState{}
	}
	e.told.invoices[s.ID] = s
	return nil
}

type priceRefJSON struct {
	ID     string `json:"id"`
	Object string `json:"object"`
}

type subscriptionItemJSON struct {
	ID           string       `json:"id"`
	Object       string       `json:"object"`
	Price        priceRefJSON `json:"price"`
	Quantity     int64        `json:"quantity"`
	Subscription string       `json:"subscription"`
}

type subscriptionJSON struct {
	ID                string                         `json:"id"`
	Object            string                         `json:"object"`
	Customer          string                         `json:"customer"`
	Status            string                         `json:"status"`
	CurrentPeriodEnd  int64                          `json:"current_period_end"`
	CancelAtPeriodEnd bool                           `json:"cancel_at_period_end"`
	Livemode          bool                           `json:"livemode"`
	Metadata          map[string]string              `json:"metadata"`
	Items             listBody[subscriptionItemJSON] `json:"items"`
}

func (s SubscriptionState) json(livemode bool) subscriptionJSON {
	out := subscriptionJSON{ID: s.ID, Object: "subscription", Customer: s.Customer, Status: s.Status,
		CancelAtPeriodEnd: s.CancelAtPeriodEnd, Livemode: livemode, Metadata: map[string]string{},
		Items: listBody[subscriptionItemJSON]{Object: "list", URL: "/v1/subscription_items?subscription=" + s.ID, Data: []subscriptionItemJSON{}}}
	if !s.CurrentPeriodEnd.IsZero() {
		out.CurrentPeriodEnd = s.CurrentPeriodEnd.Unix()
	}
	for i, p := range s.PriceIDs {
		out.Items.Data = append(out.Items.Data, subscriptionItemJSON{ID: "si_" + strings.TrimPrefix(s.ID, "sub_") + strconv.Itoa(i),
			Object: "subscription_item", Price: priceRefJSON{ID: p, Object: "price"}, Quantity: 1, Subscription: s.ID})
	}
	return out
}

type toldInvoiceJSON struct {
	ID           string  `json:"id"`
	Object       string  `json:"object"`
	Customer     string  `json:"customer"`
	Subscription *string `json:"subscription"`
	Status       string  `json:"status"`
	Paid         bool    `json:"paid"`
	Attempted    bool    `json:"attempted"`
	AttemptCount int64   `json:"attempt_count"`
	Livemode     bool    `json:"livemode"`
}

func (s InvoiceState) json(livemode bool) toldInvoiceJSON {
	out := toldInvoiceJSON{ID: s.ID, Object: "invoice", Customer: s.Customer, Subscription: optional(s.Subscription),
		Status: s.Status, Paid: s.Status == "paid", Attempted: s.Attempted, Livemode: livemode}
	if s.Attempted {
		out.AttemptCount = 1
	}
	return out
}

func (e *Emulator) registerObjects(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/subscriptions/{id}", e.authed(RouteSubscriptionGet, e.handleSubscriptionGet))
	mux.HandleFunc("GET /v1/invoices/{id}", e.authed(RouteInvoiceGet, e.handleInvoiceGet))
	mux.HandleFunc("POST /_emulator/subscriptions", e.control(func(r *http.Request) error {
		s := SubscriptionState{ID: r.PostFormValue("id"), Customer: r.PostFormValue("customer"), Status: r.PostFormValue("status"),
			PriceIDs: r.PostForm["price"]}
		if v := r.PostFormValue("current_period_end"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("%w: current_period_end must be Unix seconds", ErrInvalidObject)
			}
			s.CurrentPeriodEnd = time.Unix(n, 0).UTC()
		}
		var err error
		if s.CancelAtPeriodEnd, err = formBool(r.PostFormValue("cancel_at_period_end")); err != nil {
			return err
		}
		return e.SetSubscription(s)
	}))
	mux.HandleFunc("POST /_emulator/invoices", e.control(func(r *http.Request) error {
		s := InvoiceState{ID: r.PostFormValue("id"), Customer: r.PostFormValue("customer"),
			Subscription: r.PostFormValue("subscription"), Status: r.PostFormValue("status")}
		var err error
		if s.Attempted, err = formBool(r.PostFormValue("attempted")); err != nil {
			return err
		}
		return e.SetInvoice(s)
	}))
}

// formBool reads "", "true" or "false".
func formBool(v string) (bool, error) {
	switch v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, fmt.Errorf("%w: a boolean must be true or false", ErrInvalidObject)
	}
}

func (e *Emulator) handleSubscriptionGet(c *call) reply {
	if ae := checkParams(c.form, "expand[*]"); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	id := c.r.PathValue("id")
	e.mu.Lock()
	s, ok := e.told.subs[id]
	e.mu.Unlock()
	if !ok {
		return errReply(notFound("id", "No such subscription: '%s'", id), OutcomeInvalid)
	}
	return jsonReply(http.StatusOK, s.json(c.livemode), OutcomeOK)
}

func (e *Emulator) handleInvoiceGet(c *call) reply {
	if ae := checkParams(c.form, "expand[*]"); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	id := c.r.PathValue("id")
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.told.invoices[id]; ok {
		return jsonReply(http.StatusOK, s.json(c.livemode), OutcomeOK)
	}
	// a metered subscription's finalized invoice (reconcile.go)
	seen := map[string]bool{}
	for _, sub := range e.rec.subs {
		if seen[sub.customer] {
			continue
		}
		seen[sub.customer] = true
		for _, inv := range e.invoicesLocked(sub.customer, e.cfg.Now(), c.livemode) {
			if inv.ID == id {
				return jsonReply(http.StatusOK, inv, OutcomeOK)
			}
		}
	}
	return errReply(notFound("id", "No such invoice: '%s'", id), OutcomeInvalid)
}
