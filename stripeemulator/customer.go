package stripeemulator

import (
	"fmt"
	"net/http"
	"slices"
	"time"
	"unicode/utf8"
)

// customer is a provisioned customer. Only what the API echoes is kept, each
// field bounded (Stripe's limits: 500 characters per string, 50 metadata
// keys of at most 40 characters).
type customer struct {
	ID          string
	Created     time.Time
	Name        string
	Email       string
	Description string
	Metadata    map[string]string
}

type customerJSON struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	Livemode    bool              `json:"livemode"`
	Name        *string           `json:"name"`
	Email       *string           `json:"email"`
	Description *string           `json:"description"`
	Metadata    map[string]string `json:"metadata"`
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (c *customer) json(livemode bool) customerJSON {
	md := c.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return customerJSON{ID: c.ID, Object: "customer", Created: c.Created.Unix(), Livemode: livemode,
		Name: optional(c.Name), Email: optional(c.Email), Description: optional(c.Description), Metadata: md}
}

// customerParams are the creation parameters the emulator takes; others
// that stripe-go's CustomerParams can send are refused as unknown.
var customerParams = []string{"name", "email", "description", "metadata[*]", "expand[*]", "phone"}

// AddCustomer provisions a customer with the given id (e.g. "cus_demo1") as
// if created through the API. Adding an existing id is a no-op. An empty id
// or one longer than 255 bytes is ErrInvalidCustomer.
func (e *Emulator) AddCustomer(id string) error {
	if id == "" || len(id) > 255 {
		return fmt.Errorf("%w: id must be 1..255 bytes", ErrInvalidCustomer)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.customers[id]; !ok {
		e.customers[id] = &customer{ID: id, Created: e.cfg.Now()}
		e.custOrder = append(e.custOrder, id)
	}
	return nil
}

// DeleteCustomer removes a customer; later meter events naming it are 400
// meter_event_customer_not_found. It reports whether the customer existed.
func (e *Emulator) DeleteCustomer(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.customers[id]; !ok {
		return false
	}
	delete(e.customers, id)
	if i := slices.Index(e.custOrder, id); i >= 0 {
		e.custOrder = slices.Delete(e.custOrder, i, i+1)
	}
	return true
}

// HasCustomer reports whether id is a known customer.
func (e *Emulator) HasCustomer(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.customers[id]
	return ok
}

func boundedString(param, v string, max int) *apiError {
	if utf8.RuneCountInString(v) > max {
		return invalidRequest(CodeParameterInvalid, param, "Invalid string: %s must be at most %d characters", param, max)
	}
	return nil
}

func (e *Emulator) handleCustomerCreate(c *call) reply {
	if ae := checkParams(c.form, customerParams...); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	cu := &customer{Name: c.form.Get("name"), Email: c.form.Get("email"), Description: c.form.Get("description")}
	for _, f := range []struct{ name, v string }{{"name", cu.Name}, {"email", cu.Email}, {"description", cu.Description}} {
		if ae := boundedString(f.name, f.v, 500); ae != nil {
			return errReply(ae, OutcomeInvalid)
		}
	}
	md := nested(c.form, "metadata")
	if len(md) > 50 {
		return errReply(invalidRequest(CodeParameterInvalid, "metadata", "Invalid metadata: at most 50 keys"), OutcomeInvalid)
	}
	for k, v := range md {
		if utf8.RuneCountInString(k) > 40 || utf8.RuneCountInString(v) > 500 {
			return errReply(invalidRequest(CodeParameterInvalid, "metadata", "Invalid metadata: keys at most 40 characters, values at most 500"), OutcomeInvalid)
		}
	}
	if len(md) > 0 {
		cu.Metadata = md
	}
	return e.idempotent(c, func() executed {
		e.mu.Lock()
		defer e.mu.Unlock()
		cu.ID = e.newID("cus_", 14)
		cu.Created = e.cfg.Now()
		e.customers[cu.ID] = cu
		e.custOrder = append(e.custOrder, cu.ID)
		return executed{reply: jsonReply(http.StatusOK, cu.json(c.livemode), OutcomeOK), save: true}
	})
}

func (e *Emulator) handleCustomerGet(c *call) reply {
	if ae := checkParams(c.form, "expand[*]"); ae != nil {
		return errReply(ae, OutcomeInvalid)
	}
	id := c.r.PathValue("id")
	e.mu.Lock()
	cu, ok := e.customers[id]
	var body customerJSON
	if ok {
		body = cu.json(c.livemode)
	}
	e.mu.Unlock()
	if !ok {
		return errReply(notFound("id", "No such customer: '%s'", id), OutcomeInvalid)
	}
	return jsonReply(http.StatusOK, body, OutcomeOK)
}

func (e *Emulator) handleCustomerDelete(c *call) reply {
	id := c.r.PathValue("id")
	if !e.DeleteCustomer(id) {
		return errReply(notFound("id", "No such customer: '%s'", id), OutcomeInvalid)
	}
	return jsonReply(http.StatusOK, map[string]any{"id": id, "object": "customer", "deleted": true}, OutcomeOK)
}
