package config

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
)

// Defaults and ranges of the database session bounds, in milliseconds. 0
// turns a bound off (Postgres's meaning).
const (
	// StatementTimeoutMSDefault: no statement of aurora's runs longer than a
	// few seconds; 30 s bounds a stuck one (and the advisory or row locks
	// its transaction holds) while leaving room for a slow disk.
	StatementTimeoutMSDefault = 30_000
	// LockTimeoutMSDefault: waiting 10 s for a row or table lock means
	// another transaction is stuck; fail, roll back and retry instead.
	LockTimeoutMSDefault = 10_000
	// IdleInTransactionTimeoutMSDefault: aurora never leaves a transaction
	// idle while it talks to Stripe or NATS; 60 s ends one a crashed or
	// stalled client left open, releasing its locks.
	IdleInTransactionTimeoutMSDefault = 60_000
	// SessionTimeoutMSMin, SessionTimeoutMSMax: the allowed range of each
	// non-zero bound (100 ms .. 1 h).
	SessionTimeoutMSMin = 100
	SessionTimeoutMSMax = 3_600_000
)

// DatabaseSession bounds what one database session can hold: Postgres's
// statement_timeout, lock_timeout and idle_in_transaction_session_timeout,
// sent as runtime parameters when a pooled connection opens (SessionURL).
// Migrations run without them: DDL on a large table may legitimately run
// longer.
type DatabaseSession struct {
	// StatementTimeoutMS: the longest one statement runs before Postgres
	// cancels it (and its transaction rolls back). 0 or 100..3600000;
	// defaults to 30000.
	StatementTimeoutMS int `env:"DATABASE_STATEMENT_TIMEOUT_MS" envDefault:"30000"`
	// LockTimeoutMS: the longest a statement waits for a lock. 0 or
	// 100..3600000 and at most StatementTimeoutMS; defaults to 10000.
	LockTimeoutMS int `env:"DATABASE_LOCK_TIMEOUT_MS" envDefault:"10000"`
	// IdleInTransactionTimeoutMS: the longest a transaction may sit idle
	// before Postgres ends the session. 0 or 100..3600000; defaults to
	// 60000.
	IdleInTransactionTimeoutMS int `env:"DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS" envDefault:"60000"`
}

func sessionBound(name string, v int) error {
	if v == 0 {
		return nil
	}
	if v < SessionTimeoutMSMin || v > SessionTimeoutMSMax {
		return &RangeError{Var: Prefix + name, Value: fmt.Sprint(v),
			Allowed: fmt.Sprintf("0 (off) or %d..%d (milliseconds)", SessionTimeoutMSMin, SessionTimeoutMSMax)}
	}
	return nil
}

// Validate names every bound out of its range; each error is a
// *RangeError.
func (s DatabaseSession) Validate() error {
	stmt := sessionBound("DATABASE_STATEMENT_TIMEOUT_MS", s.StatementTimeoutMS)
	lock := sessionBound("DATABASE_LOCK_TIMEOUT_MS", s.LockTimeoutMS)
	// The order is judged only between bounds each in range: one mistake,
	// one error.
	var order error
	if stmt == nil && lock == nil && s.LockTimeoutMS != 0 && s.StatementTimeoutMS != 0 {
		order = Relation("DATABASE_LOCK_TIMEOUT_MS", s.LockTimeoutMS, "<=", "DATABASE_STATEMENT_TIMEOUT_MS", s.StatementTimeoutMS,
			"a statement cannot wait for a lock longer than it may run")
	}
	return errors.Join(stmt, lock,
		sessionBound("DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS", s.IdleInTransactionTimeoutMS),
		order,
	)
}

// Params returns the runtime parameters of the non-zero bounds, in
// Postgres's names, values in milliseconds.
func (s DatabaseSession) Params() map[string]string {
	out := map[string]string{}
	for name, v := range map[string]int{
		"statement_timeout":                   s.StatementTimeoutMS,
		"lock_timeout":                        s.LockTimeoutMS,
		"idle_in_transaction_session_timeout": s.IdleInTransactionTimeoutMS,
	} {
		if v != 0 {
			out[name] = strconv.Itoa(v)
		}
	}
	return out
}

// SessionURL returns URL with the session bounds as query parameters, which
// pgx sends as runtime parameters when each connection opens. A parameter
// the URL sets itself keeps the URL's value. A URL that does not parse is
// returned unchanged (Validate reports it).
func (d Database) SessionURL() string {
	u, err := url.Parse(d.URL)
	if err != nil {
		return d.URL
	}
	q := u.Query()
	for k, v := range d.Session.Params() {
		if !q.Has(k) {
			q.Set(k, v)
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}
