package stripeemulator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76/webhook"
)

// What the reconciler reads from Stripe, emulated: summaries that lag
// behind received events, meter error reports delivered as signed thin
// events (GET /v2/core/events/{id} answers the full event), and metered
// subscriptions whose invoices finalize after a grace period.

// Defaults of ReconcileConfig.
const (
	// InvoiceGraceDefault: Stripe finalizes a subscription invoice an hour
	// after its period ends by default; usage received by then is billed.
	InvoiceGraceDefault = time.Hour
	// SampleErrorsPerType: samples a meter error report carries per error
	// code (Stripe sends "a few", not every failed event).
	SampleErrorsPerType = 3
	// maxInvoicePeriods bounds the periods listed per subscription.
	maxInvoicePeriods = 400
)

// Thin event types of meter error reports (Stripe sends both to an event
// destination as v2 thin events).
const (
	EventMeterErrorReport = "v1.billing.meter.error_report_triggered"
	EventNoMeterFound     = "v1.billing.meter.no_meter_found"
)

// ReconcileConfig configures what the reconciler reads. The zero value:
// summaries immediately consistent, no error report delivery, a 1 h grace.
type ReconcileConfig struct {
	// SummaryLag: an applied event shows in event_summaries only once it
	// was received at least this long ago (Stripe's summaries are
	// eventually consistent). Defaults to 0; SetSummaryLag varies it.
	SummaryLag time.Duration
	// ErrorReportURL: where FlushErrorReports posts the thin events (an
	// inbox's /webhooks/stripe). Empty: reports are kept, not delivered.
	ErrorReportURL string
	// ErrorReportSecret: the endpoint signing secret (whsec_…).
	ErrorReportSecret string
	// InvoiceGrace: how long after a period ends its invoice finalizes.
	// Defaults to InvoiceGraceDefault.
	InvoiceGrace time.Duration
}

type reconState struct {
	summaryLag time.Duration
	delivered  int // e.reports[:delivered] are in an event
	events     map[string]*coreEvent
	eventOrder []string
	prices     map[string]string // price → meter
	subs       []*meteredSub
}

type coreEvent struct {
	thin      thinEventJSON
	data      errorReportDataJSON
	delivered bool
}

type relatedObjectJSON struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	URL  string `json:"url"`
}

type thinEventJSON struct {
	ID            string             `json:"id"`
	Object        string             `json:"object"`
	Type          string             `json:"type"`
	Created       string             `json:"created"`
	Livemode      bool               `json:"livemode"`
	Context       *string            `json:"context"`
	Reason        *string            `json:"reason"`
	RelatedObject *relatedObjectJSON `json:"related_object,omitempty"`
}

type sampleErrorJSON struct {
	ErrorMessage string `json:"error_message"`
	Request      struct {
		Identifier string `json:"identifier"`
	} `json:"request"`
}

type errorTypeJSON struct {
	Code         string            `json:"code"`
	ErrorCount   int64             `json:"error_count"`
	SampleErrors []sampleErrorJSON `json:"sample_errors"`
}

type errorReportDataJSON struct {
	ValidationStart         string `json:"validation_start"`
	ValidationEnd           string `json:"validation_end"`
	DeveloperMessageSummary string `json:"developer_message_summary"`
	Reason                  struct {
		ErrorCount int64           `json:"error_count"`
		ErrorTypes []errorTypeJSON `json:"error_types"`
	} `json:"reason"`
}

type meteredSub struct {
	id, customer, price, meter string
	start                      time.Time
	interval                   time.Duration
}

func (e *Emulator) initReconcile() {
	if e.cfg.Reconcile.InvoiceGrace == 0 {
		e.cfg.Reconcile.InvoiceGrace = InvoiceGraceDefault
	}
	e.rec = reconState{summaryLag: e.cfg.Reconcile.SummaryLag, events: map[string]*coreEvent{}, prices: map[string]string{}}
}

func (e *Emulator) registerReconcile(mux *http.ServeMux) {
	mux.HandleFunc("GET /v2/core/events/{id}", e.authed(RouteCoreEventGet, e.handleCoreEventGet))
	mux.HandleFunc("GET /v1/invoices", e.authed(RouteInvoiceList, e.handleInvoiceList))
	mux.HandleFunc("POST /_emulator/summary-lag", e.control(func(r *http.Request) error {
		d, err := time.ParseDuration(r.PostFormValue("lag"))
		if err != nil || d < 0 {
			return fmt.Errorf("lag %q is not a non-negative Go duration", r.PostFormValue("lag"))
		}
		e.SetSummaryLag(d)
		return nil
	}))
	mux.HandleFunc("POST /_emulator/double-apply", e.control(func(r *http.Request) error {
		return e.ApplyTwice(r.PostFormValue("identifier"))
	}))
	mux.HandleFunc("POST /_emulator/error-reports/flush", e.control(func(r *http.Request) error {
		_, err := e.FlushErrorReports(r.Context())
		return err
	}))
}

// Routes of the reconciliation endpoints.
const (
	RouteCoreEventGet Route = "GET /v2/core/events/{id}"
	RouteInvoiceList  Route = "GET /v1/invoices"
)

// SetSummaryLag changes the summary lag from now on (the fault that varies
// it).
func (e *Emulator) SetSummaryLag(d time.Duration) {
	e.mu.Lock()
	e.rec.summaryLag = max(0, d)
	e.mu.Unlock()
}

// lagged reports whether ev is not yet visible in summaries at now.
// Callers hold e.mu.
func (e *Emulator) lagged(ev *AppliedEvent, now time.Time) bool {
	return e.rec.summaryLag > 0 && now.Sub(ev.ReceivedAt) < e.rec.summaryLag
}

// ErrNotApplied: ApplyTwice was given an identifier never applied.
var ErrNotApplied = errors.New("stripeemulator: identifier was never applied")

// ApplyTwice applies identifier's latest application once more, as a
// broken dedupe would: the injected double application the reconciler
// must find as summary_excess. It shows in DuplicateApplications.
func (e *Emulator) ApplyTwice(identifier string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.ids[identifier]
	if !ok || st.applications == 0 {
		return fmt.Errorf("%w: %q", ErrNotApplied, identifier)
	}
	ev := e.events[st.last]
	ev.ReceivedAt = e.cfg.Now()
	idx := len(e.events)
	e.events = append(e.events, ev)
	if e.totals[ev.EventName] != nil {
		e.totals[ev.EventName].Add(e.totals[ev.EventName], ev.ExactValue())
	}
	st.applications++
	st.last = idx
	e.ids[identifier] = st
	if st.applications == 2 {
		e.duplicates = append(e.duplicates, identifier)
	}
	pk := pairKey{ev.MeterID, ev.Customer}
	e.byPair[pk] = append(e.byPair[pk], idx)
	return nil
}

// FlushErrorReports turns the asynchronous rejections recorded since the
// last flush into meter error report events — one per meter (or one
// v1.billing.meter.no_meter_found per unknown event name), with each
// code's count and at most SampleErrorsPerType samples carrying the
// identifier — and posts each as a signed thin event to
// ReconcileConfig.ErrorReportURL. It returns the new event ids. Events
// whose delivery failed are posted again by the next flush; the error says
// how many failed.
func (e *Emulator) FlushErrorReports(ctx context.Context) ([]string, error) {
	e.mu.Lock()
	now := e.cfg.Now().UTC()
	pending := e.reports[e.rec.delivered:]
	e.rec.delivered = len(e.reports)
	type group struct {
		meter, eventName string
		reports          []ErrorReport
	}
	groups := map[string]*group{}
	var keys []string
	for _, r := range pending {
		m := e.meterForEvent(r.EventName)
		k := "name:" + r.EventName
		g := &group{eventName: r.EventName}
		if m != nil && r.Code != CodeNoMeter {
			k, g = "meter:"+m.ID, &group{meter: m.ID, eventName: r.EventName}
		}
		if _, ok := groups[k]; !ok {
			groups[k] = g
			keys = append(keys, k)
		}
		groups[k].reports = append(groups[k].reports, r)
	}
	var ids []string
	for _, k := range keys {
		g := groups[k]
		ev := &coreEvent{thin: thinEventJSON{ID: e.newID("evt_", 24), Object: "v2.core.event", Type: EventMeterErrorReport,
			Created: now.Format(time.RFC3339Nano)}}
		if g.meter != "" {
			ev.thin.RelatedObject = &relatedObjectJSON{ID: g.meter, Type: "billing.meter", URL: "/v1/billing/meters/" + g.meter}
		} else {
			ev.thin.Type = EventNoMeterFound
		}
		first, last := g.reports[0].ReceivedAt, g.reports[0].ReceivedAt
		byCode := map[string]*errorTypeJSON{}
		var codes []string
		for _, r := range g.reports {
			first, last = minTime(first, r.ReceivedAt), maxTime(last, r.ReceivedAt)
			et, ok := byCode[r.Code]
			if !ok {
				et = &errorTypeJSON{Code: r.Code, SampleErrors: []sampleErrorJSON{}}
				byCode[r.Code] = et
				codes = append(codes, r.Code)
			}
			et.ErrorCount++
			if len(et.SampleErrors) < SampleErrorsPerType {
				s := sampleErrorJSON{ErrorMessage: errorMessage(r.Code)}
				s.Request.Identifier = r.Identifier
				et.SampleErrors = append(et.SampleErrors, s)
			}
		}
		ev.data.ValidationStart = first.UTC().Truncate(time.Minute).Format(time.RFC3339)
		ev.data.ValidationEnd = last.UTC().Truncate(time.Minute).Add(time.Minute).Format(time.RFC3339)
		for _, c := range codes {
			ev.data.Reason.ErrorTypes = append(ev.data.Reason.ErrorTypes, *byCode[c])
			ev.data.Reason.ErrorCount += byCode[c].ErrorCount
		}
		ev.data.DeveloperMessageSummary = fmt.Sprintf("%d meter events for %s failed validation", ev.data.Reason.ErrorCount, g.eventName)
		e.rec.events[ev.thin.ID] = ev
		e.rec.eventOrder = append(e.rec.eventOrder, ev.thin.ID)
		ids = append(ids, ev.thin.ID)
	}
	var toSend []*coreEvent
	for _, id := range e.rec.eventOrder {
		if ev := e.rec.events[id]; !ev.delivered {
			toSend = append(toSend, ev)
		}
	}
	url, secret := e.cfg.Reconcile.ErrorReportURL, e.cfg.Reconcile.ErrorReportSecret
	e.mu.Unlock()
	if url == "" {
		return ids, nil
	}
	failed := 0
	for _, ev := range toSend {
		if err := postThin(ctx, url, secret, ev.thin); err != nil {
			failed++
			continue
		}
		e.mu.Lock()
		ev.delivered = true
		e.mu.Unlock()
	}
	if failed > 0 {
		return ids, fmt.Errorf("stripeemulator: %d error report events not delivered (kept for the next flush)", failed)
	}
	return ids, nil
}

func errorMessage(code string) string {
	switch code {
	case CodeCustomerNotFound:
		return "No customer found for the meter event's customer mapping."
	case CodeNoMeter:
		return "No active meter was found for the meter event's event_name."
	default:
		return "The meter event failed validation: " + code + "."
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// postThin posts a signed thin event (Stripe-Signature t=…,v1=… over the
// body, as Stripe signs event destinations). The signature's timestamp is
// the wall clock at delivery, not Config.Now: receivers check it against
// their own clock.
func postThin(ctx context.Context, url, secret string, thin thinEventJSON) error {
	body, err := json.Marshal(thin)
	if err != nil {
		return err
	}
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: time.Now()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", signed.Header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

// CoreEventIDs returns the ids of every error report event made so far.
func (e *Emulator) CoreEventIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.rec.eventOrder)
}

func (e *Emulator) handleCoreEventGet(c *call) reply {
	id := c.r.PathValue("id")
	e.mu.Lock()
	ev, ok := e.rec.events[id]
	var body any
	if ok {
		body = struct {
			thinEventJSON
			Data errorReportDataJSON `json:"data"`
		}{ev.thin, ev.data}
	}
	e.mu.Unlock()
	if !ok {
		return errReply(notFound("id", "No such event: '%s'", id), OutcomeInvalid)
	}
	return jsonReply(http.StatusOK, body, OutcomeOK)
}

// AddMeteredPrice creates a metered recurring price on meterID.
func (e *Emulator) AddMeteredPrice(priceID, meterID string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.meters[meterID]; !ok {
		return fmt.Errorf("stripeemulator: no meter %q", meterID)
	}
	if !strings.HasPrefix(priceID, "price_") {
		return fmt.Errorf("stripeemulator: price id %q must start with price_", priceID)
	}
	e.rec.prices[priceID] = meterID
	return nil
}

// SubscribeMetered subscribes customer to priceID from start, billed every
// interval: the invoice of each period [start+k·interval, start+(k+1)·
// interval) finalizes InvoiceGrace after the period ends, billing the
// customer's uncancelled events on the price's meter with a timestamp in
// the period and received by the finalization. It returns the
// subscription id.
func (e *Emulator) SubscribeMetered(customer, priceID string, start time.Time, interval time.Duration) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	meter, ok := e.rec.prices[priceID]
	switch {
	case !ok:
		return "", fmt.Errorf("stripeemulator: no metered price %q", priceID)
	case e.customers[customer] == nil:
		return "", fmt.Errorf("stripeemulator: no customer %q", customer)
	case interval < time.Minute:
		return "", fmt.Errorf("stripeemulator: interval %s below a minute", interval)
	}
	id := e.newID("sub_", 14)
	e.rec.subs = append(e.rec.subs, &meteredSub{id: id, customer: customer, price: priceID, meter: meter, start: start.UTC(), interval: interval})
	return id, nil
}

type invoiceLineJSON struct {
	ID       string `json:"id"`
	Object   string `json:"object"`
	Type     string `json:"type"`
	Quantity int64  `json:"quantity"`
	Period   struct {
		Start int64 `json:"start"`
		End   int64 `json:"end"`
	} `json:"period"`
	Price struct {
		ID        string `json:"id"`
		Object    string `json:"object"`
		Recurring struct {
			Meter     string `json:"meter"`
			UsageType string `json:"usage_type"`
		} `json:"recurring"`
	} `json:"price"`
	Subscription string `json:"subscription"`
}

type invoiceJSON struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Customer          string `json:"customer"`
	Status            string `json:"status"`
	Created           int64  `json:"created"`
	Livemode          bool   `json:"livemode"`
	Subscription      string `json:"subscription"`
	StatusTransitions struct {
		FinalizedAt int64 `json:"finalized_at"`
	} `json:"status_transitions"`
	Lines listBody[invoiceLineJSON] `json:"lines"`
}

// invoicesLocked computes customer's finalized invoices at now, newest
// first. Callers hold e.mu.
func (e *Emulator) invoicesLocked(customer string, now time.Time, livemode bool) []invoiceJSON {
	var out []invoiceJSON
	for _, s := range e.rec.subs {
		if s.customer != customer {
			continue
		}
		for k := 0; k < maxInvoicePeriods; k++ {
			ps := s.start.Add(time.Duration(k) * s.interval)
			pe := ps.Add(s.interval)
			fin := pe.Add(e.cfg.Reconcile.InvoiceGrace)
			if fin.After(now) {
				break
			}
			var qty float64
			for _, idx := range e.byPair[pairKey{s.meter, customer}] {
				ev := e.events[idx]
				if ev.Cancelled || ev.Timestamp.Before(ps) || !ev.Timestamp.Before(pe) || ev.ReceivedAt.After(fin) {
					continue
				}
				qty += ev.Value
			}
			sum := sha256.Sum256([]byte(s.id + "|" + strconv.Itoa(k)))
			inv := invoiceJSON{ID: "in_" + hex.EncodeToString(sum[:8]), Object: "invoice", Customer: customer, Status: "open",
				Created: pe.Unix(), Livemode: livemode, Subscription: s.id}
			inv.StatusTransitions.FinalizedAt = fin.Unix()
			line := invoiceLineJSON{ID: "il_" + hex.EncodeToString(sum[8:16]), Object: "line_item", Type: "subscription",
				Quantity: int64(qty), Subscription: s.id}
			line.Period.Start, line.Period.End = ps.Unix(), pe.Unix()
			line.Price.ID, line.Price.Object = s.price, "price"
			line.Price.Recurring.Meter, line.Price.Recurring.UsageType = s.meter, "metered"
			inv.Lines = listBody[invoiceLineJSON]{Object: "list", URL: "/v1/invoices/" + inv.ID + "/lines", Data: []invoiceLineJSON{line}}
			out = append(out, inv)
		}
	}
	slices.SortStableFunc(out, func(a, b invoiceJSON) int { return int(b.Created - a.Created) })
	return out
}

var invoiceListParams = []string{"customer", "created[*]", "created", "status", "subscription", "limit", "starting_after", "ending_before", "expand[*]"}

// handleInvoiceList is GET /v1/invoices: customer (required here), created
// (gte, gt, lte, lt), status, subscription, pagination; newest first.
func (e *Emulator) handleInvoiceList(c *call) reply {
	if ae := checkParams(c.form, invoiceListParams...); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	cust := c.form.Get("customer")
	if cust == "" {
		return errReply(invalidRequest(CodeParameterMissing, "customer", "Missing required param: customer."), OutcomeInvalid)
	}
	lp, ae := parseList(c.form)
	if ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	bounds := map[string]int64{}
	for _, op := range []string{"gte", "gt", "lte", "lt"} {
		v, ok, ae := intParam(c.form, "created["+op+"]")
		if ae != nil {
			return errReply(ae, OutcomeInvalid)
		}
		if ok {
			bounds[op] = v
		}
	}
	e.mu.Lock()
	all := e.invoicesLocked(cust, e.cfg.Now(), c.livemode)
	e.mu.Unlock()
	var kept []invoiceJSON
	for _, inv := range all {
		if v, ok := bounds["gte"]; ok && inv.Created < v {
			continue
		}
		if v, ok := bounds["gt"]; ok && inv.Created <= v {
			continue
		}
		if v, ok := bounds["lte"]; ok && inv.Created > v {
			continue
		}
		if v, ok := bounds["lt"]; ok && inv.Created >= v {
			continue
		}
		if s := c.form.Get("status"); s != "" && inv.Status != s {
			continue
		}
		if s := c.form.Get("subscription"); s != "" && inv.Subscription != s {
			continue
		}
		kept = append(kept, inv)
	}
	ids := make([]string, len(kept))
	byID := map[string]invoiceJSON{}
	for i, inv := range kept {
		ids[i] = inv.ID
		byID[inv.ID] = inv
	}
	pageIDs, more, ok := page(ids, lp)
	if !ok {
		return errReply(invalidRequest(CodeResourceMissing, "starting_after", "No such invoice in this list."), OutcomeInvalid)
	}
	body := listBody[invoiceJSON]{Object: "list", URL: "/v1/invoices", HasMore: more, Data: []invoiceJSON{}}
	for _, id := range pageIDs {
		body.Data = append(body.Data, byID[id])
	}
	return jsonReply(http.StatusOK, body, OutcomeOK)
}
