// Package clock decides what "now" means for liveness and ordering decisions.
//
// Production code uses the database clock: SQL evaluates
// coalesce($n::timestamptz, now()) with a nil override, so every replica
// compares leases, backoff and horizons against one clock (Postgres's).
// Tests inject a Manual clock whose Override is a fixed instant they advance
// explicitly, so nothing sleeps for a real lease, backoff or horizon (the
// pattern River uses with coalesce(@now, now())).
package clock

import (
	"sync"
	"time"
)

// Clock yields the override passed to SQL as "now". A nil override means
// "use the database's now()".
type Clock interface {
	// Override returns nil for the database clock, or the instant to use.
	Override() *time.Time
}

// DB is the production clock: the database's now().
type DB struct{}

// Override returns nil: SQL falls back to now().
func (DB) Override() *time.Time { return nil }

// Manual is a controllable clock for tests. The zero value is not usable;
// use NewManual.
type Manual struct {
	mu  sync.Mutex
	now time.Time
}

// NewManual returns a Manual clock set to t.
func NewManual(t time.Time) *Manual { return &Manual{now: t.UTC()} }

// Override returns the current manual instant.
func (m *Manual) Override() *time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.now
	return &t
}

// Now returns the current manual instant.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward by d.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	m.now = m.now.Add(d)
	m.mu.Unlock()
}

// Set moves the clock to t.
func (m *Manual) Set(t time.Time) {
	m.mu.Lock()
	m.now = t.UTC()
	m.mu.Unlock()
}

// Or returns c, or DB{} when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return DB{}
	}
	return c
}
