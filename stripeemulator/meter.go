package stripeemulator

import (
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Aggregation is a meter's default_aggregation[formula].
type Aggregation string

const (
	// AggregationSum sums payload values.
	AggregationSum Aggregation = "sum"
	// AggregationCount counts events.
	AggregationCount Aggregation = "count"
)

// Default payload keys of a meter (Stripe's defaults).
const (
	DefaultCustomerKey = "stripe_customer_id"
	DefaultValueKey    = "value"
)

// MeterSpec defines a meter for AddMeter.
type MeterSpec struct {
	// DisplayName is required.
	DisplayName string
	// EventName is required and unique among active meters.
	EventName string
	// Aggregation defaults to AggregationSum.
	Aggregation Aggregation
	// CustomerKey: payload key naming the customer. Defaults to
	// DefaultCustomerKey ("stripe_customer_id").
	CustomerKey string
	// ValueKey: payload key holding the value. Defaults to DefaultValueKey
	// ("value").
	ValueKey string
}

// Meter is a meter as stored.
type Meter struct {
	ID          string
	DisplayName string
	EventName   string
	Aggregation Aggregation
	CustomerKey string
	ValueKey    string
	Active      bool
	Created     time.Time
	Updated     time.Time
}

type meterJSON struct {
	ID              string `json:"id"`
	Object          string `json:"object"`
	Created         int64  `json:"created"`
	Updated         int64  `json:"updated"`
	Livemode        bool   `json:"livemode"`
	DisplayName     string `json:"display_name"`
	EventName       string `json:"event_name"`
	EventTimeWindow any    `json:"event_time_window"`
	Status          string `json:"status"`
	CustomerMapping struct {
		EventPayloadKey string `json:"event_payload_key"`
		Type            string `json:"type"`
	} `json:"customer_mapping"`
	DefaultAggregation struct {
		Formula string `json:"formula"`
	} `json:"default_aggregation"`
	ValueSettings struct {
		EventPayloadKey string `json:"event_payload_key"`
	} `json:"value_settings"`
	StatusTransitions struct {
		DeactivatedAt *int64 `json:"deactivated_at"`
	} `json:"status_transitions"`
}

func (m *Meter) json(livemode bool) meterJSON {
	j := meterJSON{ID: m.ID, Object: "billing.meter", Created: m.Created.Unix(), Updated: m.Updated.Unix(),
		Livemode: livemode, DisplayName: m.DisplayName, EventName: m.EventName, Status: "active"}
	if !m.Active {
		j.Status = "inactive"
		t := m.Updated.Unix()
		j.StatusTransitions.DeactivatedAt = &t
	}
	j.CustomerMapping.EventPayloadKey = m.CustomerKey
	j.CustomerMapping.Type = "by_id"
	j.DefaultAggregation.Formula = string(m.Aggregation)
	j.ValueSettings.EventPayloadKey = m.ValueKey
	return j
}

func (s *MeterSpec) normalize() error {
	if s.Aggregation == "" {
		s.Aggregation = AggregationSum
	}
	if s.CustomerKey == "" {
		s.CustomerKey = DefaultCustomerKey
	}
	if s.ValueKey == "" {
		s.ValueKey = DefaultValueKey
	}
	switch {
	case s.DisplayName == "":
		return fmt.Errorf("%w: display_name is required", ErrInvalidMeter)
	case s.EventName == "" || len(s.EventName) > 100:
		return fmt.Errorf("%w: event_name must be 1..100 bytes", ErrInvalidMeter)
	case s.Aggregation != AggregationSum && s.Aggregation != AggregationCount:
		return fmt.Errorf("%w: default_aggregation[formula] must be sum or count", ErrInvalidMeter)
	case s.CustomerKey == s.ValueKey:
		return fmt.Errorf("%w: customer and value payload keys must differ", ErrInvalidMeter)
	}
	return nil
}

// AddMeter creates an active meter as if through the API and returns it.
// Errors wrap ErrInvalidMeter: a missing display or event name, an unknown
// aggregation, equal payload keys, or an event_name already used by an
// active meter.
func (e *Emulator) AddMeter(spec MeterSpec) (Meter, error) {
	if err := spec.normalize(); err != nil {
		return Meter{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.byEvent[spec.EventName]; dup {
		return Meter{}, fmt.Errorf("%w: an active meter already has event_name %q", ErrInvalidMeter, spec.EventName)
	}
	now := e.cfg.Now()
	m := &Meter{ID: e.newID("mtr_", 24), DisplayName: spec.DisplayName, EventName: spec.EventName,
		Aggregation: spec.Aggregation, CustomerKey: spec.CustomerKey, ValueKey: spec.ValueKey,
		Active: true, Created: now, Updated: now}
	e.meters[m.ID] = m
	e.meterList = append(e.meterList, m.ID)
	e.byEvent[m.EventName] = m
	return *m, nil
}

// Meters returns every meter, oldest first.
func (e *Emulator) Meters() []Meter {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Meter, 0, len(e.meterList))
	for _, id := range e.meterList {
		out = append(out, *e.meters[id])
	}
	return out
}

// SetMeterActive deactivates (meter events for it become 400
// archived_meter) or reactivates a meter. It returns ErrInvalidMeter for an
// unknown id or when reactivating would clash with another active meter's
// event_name.
func (e *Emulator) SetMeterActive(id string, active bool) (Meter, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ae := e.setMeterActiveLocked(id, active)
	if ae != nil {
		return Meter{}, fmt.Errorf("%w: %s", ErrInvalidMeter, ae.Message)
	}
	return *e.meters[id], nil
}

func (e *Emulator) setMeterActiveLocked(id string, active bool) *apiError {
	m, ok := e.meters[id]
	if !ok {
		return notFound("id", "No such billing meter: '%s'", id)
	}
	if m.Active == active {
		state := "inactive"
		if active {
			state = "active"
		}
		return invalidRequest(CodeParameterInvalid, "", "This meter is already %s.", state)
	}
	if active {
		if other, clash := e.byEvent[m.EventName]; clash && other.ID != id {
			return invalidRequest(CodeParameterInvalid, "event_name", "An active meter already uses event_name %s.", m.EventName)
		}
		e.byEvent[m.EventName] = m
	} else if e.byEvent[m.EventName] == m {
		delete(e.byEvent, m.EventName)
	}
	m.Active = active
	m.Updated = e.cfg.Now()
	return nil
}

// meterForEvent returns the meter for event_name: the active one, else the
// newest inactive one (for archived_meter), else nil. Callers hold e.mu.
func (e *Emulator) meterForEvent(eventName string) *Meter {
	if m, ok := e.byEvent[eventName]; ok {
		return m
	}
	for i := len(e.meterList) - 1; i >= 0; i-- {
		if m := e.meters[e.meterList[i]]; m.EventName == eventName {
			return m
		}
	}
	return nil
}

var meterCreateParams = []string{"display_name", "event_name", "default_aggregation[formula]",
	"customer_mapping[event_payload_key]", "customer_mapping[type]", "value_settings[event_payload_key]",
	"event_time_window", "expand[*]"}

func (e *Emulator) handleMeterCreate(c *call) reply {
	if ae := checkParams(c.form, meterCreateParams...); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	for _, p := range []string{"display_name", "event_name", "default_aggregation[formula]"} {
		if c.form.Get(p) == "" {
			return errReply(invalidRequest(CodeParameterMissing, p, "Missing required param: %s.", p), OutcomeInvalid)
		}
	}
	if t := c.form.Get("customer_mapping[type]"); t != "" && t != "by_id" {
		return errReply(invalidRequest(CodeParameterInvalid, "customer_mapping[type]", "Invalid customer_mapping[type]: must be by_id"), OutcomeInvalid)
	}
	if w := c.form.Get("event_time_window"); w != "" && w != "day" && w != "hour" {
		return errReply(invalidRequest(CodeParameterInvalid, "event_time_window", "Invalid event_time_window: must be one of day, hour"), OutcomeInvalid)
	}
	spec := MeterSpec{DisplayName: c.form.Get("display_name"), EventName: c.form.Get("event_name"),
		Aggregation: Aggregation(c.form.Get("default_aggregation[formula]")),
		CustomerKey: c.form.Get("customer_mapping[event_payload_key]"), ValueKey: c.form.Get("value_settings[event_payload_key]")}
	return e.idempotent(c, func() executed {
		m, err := e.AddMeter(spec)
		if err != nil {
			return executed{reply: errReply(invalidRequest(CodeParameterInvalid, "", "%s", err.Error()), OutcomeInvalid)}
		}
		return executed{reply: jsonReply(http.StatusOK, m.json(c.livemode), OutcomeOK), save: true}
	})
}

func (e *Emulator) handleMeterGet(c *call) reply {
	if ae := checkParams(c.form, "expand[*]"); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	id := c.r.PathValue("id")
	e.mu.Lock()
	m, ok := e.meters[id]
	var body meterJSON
	if ok {
		body = m.json(c.livemode)
	}
	e.mu.Unlock()
	if !ok {
		return errReply(notFound("id", "No such billing meter: '%s'", id), OutcomeInvalid)
	}
	return jsonReply(http.StatusOK, body, OutcomeOK)
}

func (e *Emulator) handleMeterList(c *call) reply {
	if ae := checkParams(c.form, "limit", "starting_after", "ending_before", "status", "expand[*]"); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	lp, ae := parseList(c.form)
	if ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	status := c.form.Get("status")
	if status != "" && status != "active" && status != "inactive" {
		return errReply(invalidRequest(CodeParameterInvalid, "status", "Invalid status: must be one of active, inactive"), OutcomeInvalid)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// Newest first, as Stripe lists.
	ids := make([]string, 0, len(e.meterList))
	for _, id := range slices.Backward(e.meterList) {
		m := e.meters[id]
		if status == "" || (status == "active") == m.Active {
			ids = append(ids, id)
		}
	}
	got, more, ok := page(ids, lp)
	if !ok {
		return errReply(invalidRequest(CodeResourceMissing, "starting_after", "No such billing meter: the pagination cursor names no meter"), OutcomeInvalid)
	}
	body := listBody[meterJSON]{Object: "list", URL: "/v1/billing/meters", HasMore: more, Data: []meterJSON{}}
	for _, id := range got {
		body.Data = append(body.Data, e.meters[id].json(c.livemode))
	}
	return jsonReply(http.StatusOK, body, OutcomeOK)
}

func (e *Emulator) handleMeterDeactivate(c *call) reply { return e.meterSetActive(c, false) }
func (e *Emulator) handleMeterReactivate(c *call) reply { return e.meterSetActive(c, true) }

func (e *Emulator) meterSetActive(c *call, active bool) reply {
	if ae := checkParams(c.form, "expand[*]"); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	id := c.r.PathValue("id")
	return e.idempotent(c, func() executed {
		e.mu.Lock()
		defer e.mu.Unlock()
		if ae := e.setMeterActiveLocked(id, active); ae != nil {
			return executed{reply: errReply(ae, OutcomeInvalid)}
		}
		return executed{reply: jsonReply(http.StatusOK, e.meters[id].json(c.livemode), OutcomeOK), save: true}
	})
}
