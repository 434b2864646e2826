package stripeemulator

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"
)

// Control endpoints under /_emulator/ drive and inspect a running emulator
// from another process (the demo, `curl`). They are not Stripe's, need no
// API key, and never answer customer ids or payloads.
//
//	GET  /_emulator/stats                    Stats as JSON
//	GET  /_emulator/applied                  applied events, without customer ids
//	POST /_emulator/faults     faults=<spec> replace the random faults (ParseFaults syntax)
//	POST /_emulator/script     identifier=<id>&answers=<a,b,…>  queue scripted answers
//	POST /_emulator/customers  id=<cus_…>    provision a customer with a fixed id
//	POST /_emulator/forget-idempotency-keys  drop saved idempotent results
//	POST /_emulator/subscriptions, /_emulator/invoices  tell an object's state (objects.go)
//
// A bad form value is 400 with Stripe's error shape and the typed error's
// message.

func (e *Emulator) registerControl(mux *http.ServeMux) {
	mux.HandleFunc("GET /_emulator/stats", e.handleStats)
	mux.HandleFunc("GET /_emulator/applied", e.handleAppliedList)
	mux.HandleFunc("POST /_emulator/faults", e.control(func(r *http.Request) error {
		f, err := ParseFaults(r.PostFormValue("faults"))
		if err != nil {
			return err
		}
		return e.SetFaults(f)
	}))
	mux.HandleFunc("POST /_emulator/script", e.control(func(r *http.Request) error {
		id := r.PostFormValue("identifier")
		if id == "" {
			return errors.New("identifier is required")
		}
		answers, err := ParseAnswers(r.PostFormValue("answers"))
		if err != nil {
			return err
		}
		e.Script(id, answers...)
		return nil
	}))
	mux.HandleFunc("POST /_emulator/customers", e.control(func(r *http.Request) error {
		return e.AddCustomer(r.PostFormValue("id"))
	}))
	mux.HandleFunc("POST /_emulator/forget-idempotency-keys", e.control(func(*http.Request) error {
		e.ForgetIdempotencyKeys()
		return nil
	}))
}

// control wraps a control action: 200 {"ok":true} or 400 with the error.
func (e *Emulator) control(action func(*http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
		w.Header().Set("Content-Type", "application/json")
		if err := action(r); err != nil {
			ae := invalidRequest(CodeParameterInvalid, "", "%s", err.Error())
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(ae.body())
			return
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}
}

// appliedJSON is an applied event without its customer id.
type appliedJSON struct {
	Identifier string  `json:"identifier"`
	EventName  string  `json:"event_name"`
	Meter      string  `json:"meter"`
	Value      float64 `json:"value"`
	Timestamp  int64   `json:"timestamp"`
	ReceivedAt string  `json:"received_at"`
	Cancelled  bool    `json:"cancelled"`
}

func (e *Emulator) handleAppliedList(w http.ResponseWriter, _ *http.Request) {
	evs := e.Applied()
	out := make([]appliedJSON, 0, len(evs))
	for _, ev := range evs {
		out = append(out, appliedJSON{Identifier: ev.Identifier, EventName: ev.EventName, Meter: ev.MeterID, Value: ev.Value,
			Timestamp: ev.Timestamp.Unix(), ReceivedAt: ev.ReceivedAt.UTC().Format(time.RFC3339Nano), Cancelled: ev.Cancelled})
	}
	b, _ := json.Marshal(map[string]any{"data": out}) // plain values only
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
