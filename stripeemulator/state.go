package stripeemulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"
)

// stateVersion is the format of a state file; LoadState refuses others.
const stateVersion = 1

// ErrInvalidState: a state file that does not parse, has another version,
// or contradicts itself (an event naming an unknown meter, a duplicate
// meter or customer id). The emulator is left unchanged.
var ErrInvalidState = errors.New("stripeemulator: invalid state file")

// State is what SaveState writes and LoadState restores: the account's
// objects and every applied event, so a restarted emulator keeps its
// meters, customers, totals and summaries, and still deduplicates the
// identifiers it applied (within Config.DedupeWindow of their receipt, on
// the emulator clock). Not kept: saved idempotent results (a resend with the
// same Idempotency-Key after a restart is answered by the identifier rule,
// as Stripe answers a key past its retention), request records and counts,
// v2 sessions, pending error reports, scripts and faults (configuration).
type State struct {
	Version int `json:"version"`
	// Generation counts the loads: newly generated ids (meters, customers,
	// requests) after a restart are drawn from a stream of the seed that
	// none drew before, so they never repeat an id of the state.
	Generation uint64          `json:"generation"`
	Meters     []Meter         `json:"meters"`    // creation order
	Customers  []stateCustomer `json:"customers"` // creation order
	Events     []stateEvent    `json:"events"`    // application order; duplicates included
}

type stateCustomer struct {
	ID          string            `json:"id"`
	Created     time.Time         `json:"created"`
	Name        string            `json:"name,omitempty"`
	Email       string            `json:"email,omitempty"`
	Description string            `json:"description,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

type stateEvent struct {
	Identifier  string    `json:"identifier"`
	MeterID     string    `json:"meter_id"`
	Customer    string    `json:"customer"`
	Value       string    `json:"value"` // exact, as a rational "n" or "n/d"
	Timestamp   time.Time `json:"timestamp"`
	ReceivedAt  time.Time `json:"received_at"`
	Cancelled   bool      `json:"cancelled,omitempty"`
	CancelledAt time.Time `json:"cancelled_at,omitzero"`
}

// SaveState writes the emulator's state (see State) as JSON to w.
func (e *Emulator) SaveState(w io.Writer) error {
	e.mu.Lock()
	st := State{Version: stateVersion, Generation: e.generation, Meters: make([]Meter, 0, len(e.meterList)),
		Customers: make([]stateCustomer, 0, len(e.custOrder)), Events: make([]stateEvent, 0, len(e.events))}
	for _, id := range e.meterList {
		st.Meters = append(st.Meters, *e.meters[id])
	}
	for _, id := range e.custOrder {
		c := e.customers[id]
		st.Customers = append(st.Customers, stateCustomer{ID: c.ID, Created: c.Created, Name: c.Name, Email: c.Email, Description: c.Description, Metadata: c.Metadata})
	}
	for _, ev := range e.events {
		st.Events = append(st.Events, stateEvent{Identifier: ev.Identifier, MeterID: ev.MeterID, Customer: ev.Customer, Value: ev.ExactValue().RatString(),
			Timestamp: ev.Timestamp, ReceivedAt: ev.ReceivedAt, Cancelled: ev.Cancelled, CancelledAt: ev.CancelledAt})
	}
	e.mu.Unlock()
	return json.NewEncoder(w).Encode(st)
}

// LoadState replaces the emulator's meters, customers and applied events
// with those of r (written by SaveState), and moves its id generator to the
// next generation. It is meant for a new emulator, before it serves.
// Errors wrap ErrInvalidState; the emulator is then unchanged.
func (e *Emulator) LoadState(r io.Reader) error {
	var st State
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidState, err)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("%w: version %d, want %d", ErrInvalidState, st.Version, stateVersion)
	}
	meters, byEvent := map[string]*Meter{}, map[string]*Meter{}
	var meterList []string
	for i := range st.Meters {
		m := st.Meters[i]
		if m.ID == "" || meters[m.ID] != nil {
			return fmt.Errorf("%w: meter %d: empty or repeated id", ErrInvalidState, i)
		}
		meters[m.ID] = &m
		meterList = append(meterList, m.ID)
		if m.Active {
			if byEvent[m.EventName] != nil {
				return fmt.Errorf("%w: two active meters have event_name %q", ErrInvalidState, m.EventName)
			}
			byEvent[m.EventName] = &m
		}
	}
	customers := map[string]*customer{}
	var custOrder []string
	for i, c := range st.Customers {
		if c.ID == "" || customers[c.ID] != nil {
			return fmt.Errorf("%w: customer %d: empty or repeated id", ErrInvalidState, i)
		}
		customers[c.ID] = &customer{ID: c.ID, Created: c.Created, Name: c.Name, Email: c.Email, Description: c.Description, Metadata: c.Metadata}
		custOrder = append(custOrder, c.ID)
	}
	events := make([]AppliedEvent, 0, len(st.Events))
	for i, se := range st.Events {
		m := meters[se.MeterID]
		exact, ok := new(big.Rat).SetString(se.Value)
		if m == nil || !ok || se.Identifier == "" {
			return fmt.Errorf("%w: event %d: unknown meter, bad value or empty identifier", ErrInvalidState, i)
		}
		f, _ := exact.Float64()
		events = append(events, AppliedEvent{Identifier: se.Identifier, EventName: m.EventName, MeterID: m.ID, Customer: se.Customer,
			Value: f, exact: exact, Timestamp: se.Timestamp, ReceivedAt: se.ReceivedAt, Cancelled: se.Cancelled, CancelledAt: se.CancelledAt})
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	e.meters, e.byEvent, e.meterList = meters, byEvent, meterList
	e.customers, e.custOrder = customers, custOrder
	e.events, e.ids, e.byPair, e.duplicates, e.totals, e.cancelledN = nil, map[string]idState{}, map[pairKey][]int{}, nil, map[string]*big.Rat{}, 0
	for _, ev := range events {
		idx := len(e.events)
		e.events = append(e.events, ev)
		if e.totals[ev.EventName] == nil {
			e.totals[ev.EventName] = new(big.Rat)
		}
		if ev.Cancelled {
			e.cancelledN++
		} else {
			e.totals[ev.EventName].Add(e.totals[ev.EventName], ev.exact)
		}
		s := e.ids[ev.Identifier]
		s.applications++
		s.last = idx
		e.ids[ev.Identifier] = s
		if s.applications == 2 {
			e.duplicates = append(e.duplicates, ev.Identifier)
		}
		pk := pairKey{ev.MeterID, ev.Customer}
		e.byPair[pk] = append(e.byPair[pk], idx)
	}
	e.generation = st.Generation + 1
	e.rng = rand.New(rand.NewPCG(e.cfg.Seed, 0x5eed_57a1_9e^e.generation))
	return nil
}

// SaveStateFile writes the state to path atomically (a temporary file in
// the same directory, synced, then renamed over path), so a crash leaves
// the previous state or the new one, never half of one.
func (e *Emulator) SaveStateFile(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("stripeemulator: save state: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename: nothing to remove
	if err := e.SaveState(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("stripeemulator: save state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("stripeemulator: save state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("stripeemulator: save state: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("stripeemulator: save state: %w", err)
	}
	return nil
}

// LoadStateFile is LoadState from path; a missing file is no error (a first
// start) and reports loaded=false.
func (e *Emulator) LoadStateFile(path string) (loaded bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stripeemulator: load state: %w", err)
	}
	defer f.Close()
	if err := e.LoadState(f); err != nil {
		return false, err
	}
	return true, nil
}

// StateVersion returns a number that changes whenever something SaveState
// writes may have changed (meters, customers, applied or cancelled
// events), so a caller saving periodically can skip unchanged states.
func (e *Emulator) StateVersion() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq
}
