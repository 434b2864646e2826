package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/shared/field"
	"github.com/stripe/stripe-go/v76/webhook"
)

// Endpoint limits.
const (
	// MaxBodyBytes is the largest accepted body: 512 KiB; larger → 413.
	MaxBodyBytes = 512 << 10
	// SignatureTolerance is how old a signature timestamp may be (Stripe's
	// default, 300 s; webhook.ConstructEventWithOptions checks it).
	SignatureTolerance = 300 * time.Second
	// FutureTolerance is how far ahead of our clock a signature timestamp
	// may be. stripe-go checks only the past; we refuse a timestamp more
	// than 300 s ahead (clock skew beyond Stripe's own tolerance means a
	// forged or replay-crafted header), with the same 400 as a stale one.
	FutureTolerance = 300 * time.Second
	// storeTimeout bounds the insert; past it the answer is 503.
	storeTimeout = 10 * time.Second
)

// Sentinel errors of signature verification (all answered 400).
var (
	// ErrFutureTimestamp: the Stripe-Signature timestamp is more than
	// FutureTolerance ahead.
	ErrFutureTimestamp = errors.New("inbox: signature timestamp is in the future")
	// ErrNoEventID: a verified body that is not a JSON event with an id
	// cannot be stored.
	ErrNoEventID = errors.New("inbox: event has no id")
)

// ErrUnstorable: a verified event whose envelope can never be stored (an
// id, type, api_version or customer that fails field.Text: NUL, control
// characters, U+FFFD, longer than field.MaxStripeIDBytes). It is answered
// 422, counted as unstorable apart from store failures (outages, 503), and
// never retried into the database. See *EnvelopeError.
var ErrUnstorable = errors.New("inbox: envelope cannot be stored")

// EnvelopeError names the envelope field that cannot be stored. It wraps
// ErrUnstorable. Its message never quotes the value.
type EnvelopeError struct {
	Field  string // id, type, api_version, data.object.customer
	Reason string
}

func (e *EnvelopeError) Error() string {
	return "inbox: envelope " + e.Field + " cannot be stored: " + e.Reason
}

// Unwrap returns ErrUnstorable.
func (e *EnvelopeError) Unwrap() error { return ErrUnstorable }

// Handler is POST /webhooks/stripe: verify, store, then 200. Nothing else
// runs on the request path (seed 003).
type Handler struct {
	store   *Store
	secrets []string
	metrics *Metrics
	log     *slog.Logger
	now     func() time.Time
}

// NewHandler returns the webhook handler. secrets are tried in order
// (rotation); metrics and log may be nil.
func NewHandler(store *Store, secrets []string, metrics *Metrics, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{store: store, secrets: secrets, metrics: metrics, log: log, now: time.Now}
}

// Webhook results, the label of aurora_inbox_webhooks_total.
const (
	resultStored       = "stored"
	resultDuplicate    = "duplicate"
	resultConflict     = "id_conflict"
	resultBadSignature = "bad_signature"
	resultStale        = "stale_timestamp"
	resultFuture       = "future_timestamp"
	resultTooLarge     = "too_large"
	resultBadRequest   = "bad_request"
	resultUnstorable   = "unstorable"
	resultStoreFailed  = "store_failed"
)

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	result := h.serve(w, r)
	h.metrics.webhook(result, time.Since(start))
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) string {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "body larger than 512 KiB", http.StatusRequestEntityTooLarge)
			return resultTooLarge
		}
		http.Error(w, "could not read body", http.StatusBadRequest)
		return resultBadRequest
	}
	ev, err := h.verify(body, r.Header.Get("Stripe-Signature"))
	var envErr *EnvelopeError
	if errors.As(err, &envErr) {
		// Verified, but no retry can ever store it: a permanent answer,
		// counted apart from outages. The field, never the value.
		h.log.Warn("inbox: verified webhook cannot be stored", "field", envErr.Field, "reason", envErr.Reason)
		http.Error(w, "verified but cannot be stored: "+envErr.Field+" "+envErr.Reason, http.StatusUnprocessableEntity)
		return resultUnstorable
	}
	if err != nil {
		result := resultBadSignature
		switch {
		case errors.Is(err, webhook.ErrTooOld):
			result = resultStale
		case errors.Is(err, ErrFutureTimestamp):
			result = resultFuture
		case errors.Is(err, ErrNoEventID):
			result = resultBadRequest
		}
		http.Error(w, "invalid webhook: "+result, http.StatusBadRequest)
		return result
	}
	ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
	defer cancel()
	res, err := h.store.Ingest(ctx, ev)
	if err != nil {
		// never a 2xx without a committed row; the error class only
		h.log.Warn("inbox: webhook not stored", "error_class", errorClass(err))
		http.Error(w, "not stored; retry", http.StatusServiceUnavailable)
		return resultStoreFailed
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `{"received":true}`)
	switch res {
	case StoreInserted:
		return resultStored
	case StoreDuplicate:
		return resultDuplicate
	case StoreConflict:
		h.log.Warn("inbox: redelivered event id with a different body kept apart", "event_id", ev.EventID)
		return resultConflict
	default:
		return resultStored
	}
}

// verify checks the signature against every secret (rotation) and the
// past tolerance with stripe-go's webhook.ValidatePayloadWithTolerance —
// the verification half of webhook.ConstructEventWithOptions — then the
// future tolerance (ours), and reads the few envelope fields to store with
// a small struct of our own (ConstructEventWithOptions would also decode the
// whole event into stripe.Event's maps, half the handler's CPU, and reject
// other api_versions unless told not to). The api_version is not checked.
func (h *Handler) verify(body []byte, header string) (Received, error) {
	var lastErr error = webhook.ErrNoValidSignature
	for _, secret := range h.secrets {
		err := webhook.ValidatePayloadWithTolerance(body, header, secret, SignatureTolerance)
		if errors.Is(err, webhook.ErrNoValidSignature) {
			lastErr = err
			continue // the next secret may match
		}
		if err != nil {
			return Received{}, err
		}
		if ts, ok := signatureTimestamp(header); !ok || ts.Sub(h.now()) > FutureTolerance {
			return Received{}, ErrFutureTimestamp
		}
		return readEnvelope(body)
	}
	return Received{}, lastErr
}

// readEnvelope reads what the inbox stores next to the raw body. A body
// that is not a JSON object with an id is ErrNoEventID (400): it cannot be
// stored under a unique event id. An id, type, api_version or customer
// that Postgres text cannot hold or that breaks field.Text is an
// *EnvelopeError (ErrUnstorable, 422).
func readEnvelope(body []byte) (Received, error) {
	var env struct {
		ID         string          `json:"id"`
		Type       string          `json:"type"`
		APIVersion string          `json:"api_version"`
		Created    json.RawMessage `json:"created"` // Unix seconds, or RFC 3339 in a thin event
		Livemode   bool            `json:"livemode"`
		Data       struct {
			Object struct {
				Customer json.RawMessage `json:"customer"`
			} `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.ID == "" {
		return Received{}, ErrNoEventID
	}
	rec := Received{EventID: env.ID, Type: env.Type, APIVersion: env.APIVersion, Livemode: env.Livemode, Payload: body}
	if t, ok := eventCreated(env.Created); ok {
		rec.Created = &t
	}
	rec.Customer, _ = referenceID(env.Data.Object.Customer)
	for _, f := range []struct{ name, reason string }{
		{"id", field.Text(rec.EventID, field.MaxStripeIDBytes)},
		{"type", field.OptionalText(rec.Type, field.MaxStripeIDBytes)},
		{"api_version", field.OptionalText(rec.APIVersion, field.MaxStripeIDBytes)},
		{"data.object.customer", field.OptionalText(rec.Customer, field.MaxStripeIDBytes)},
	} {
		if f.reason != "" {
			return Received{}, &EnvelopeError{Field: f.name, Reason: f.reason}
		}
	}
	return rec, nil
}

// signatureTimestamp reads t= of a Stripe-Signature header exactly as
// stripe-go's verifier does (webhook.parseSignatureHeader): comma-separated
// key=value pairs, a pair that is not exactly one key and one value makes
// the header invalid, and the last t= wins. Reading the first t= instead
// (as this did) let "t=1,t=<future>,v1=<signature of the future time>"
// pass the future check with a time the signature does not cover (found by
// FuzzSignatureHeader).
func signatureTimestamp(header string) (time.Time, bool) {
	var ts time.Time
	found := false
	for _, pair := range strings.Split(header, ",") {
		parts := strings.Split(pair, "=")
		if len(parts) != 2 {
			return time.Time{}, false
		}
		if parts[0] == "t" {
			n, err := strconv.ParseInt(parts[1], 10, 64)
			if err != nil {
				return time.Time{}, false
			}
			ts, found = time.Unix(n, 0), true
		}
	}
	return ts, found
}
