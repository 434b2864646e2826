// Package config loads aurora's configuration from AURORA_* environment
// variables with caarlos0/env and validates every knob against its allowed
// range. A binary refuses to start on an out-of-range value, naming the
// variable and the range; every binary's --validate runs the same checks and
// exits.
//
// Defaults and ranges of the outbox knobs are seed 000's ("The knobs").
package config

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"

	"github.com/aurora-billing/aurora/shared/field"
	"github.com/caarlos0/env/v10"
)

// Prefix is prepended to every variable name.
const Prefix = "AURORA_"

// ErrInvalid is wrapped by every configuration error.
var ErrInvalid = errors.New("config: invalid")

// RangeError is an out-of-range or malformed variable, or two variables
// whose values break a relation between them (Other set). It wraps
// ErrInvalid.
type RangeError struct {
	Var     string // full variable name, e.g. "AURORA_OUTBOX_LEASE_SECONDS"
	Value   string // the value given
	Allowed string // the allowed range or set, e.g. "5..3600 (seconds)", or the type wanted
	// Malformed: the value does not parse as its type at all (Wanted then
	// names the type, e.g. "an integer"; Allowed the range when known).
	Malformed bool
	Wanted    string
	// A relation (Relation builds it): Var's value must be Op ("<", "<=",
	// ">", ">=") Other's; Why says what the relation protects. Origin and
	// OtherOrigin are "set" or "default" when Load knew the environment;
	// Load blames the variable that was set when only one of them was.
	Other, OtherValue, Op, Why string
	Origin, OtherOrigin        string
	// A relation against a bound derived from Other's value
	// (RelationBound): Expr shows how (e.g. "AURORA_X + 3600"), Bound its
	// value. Swapped: Load named the other variable first (Var, the one
	// set, leaves Other out of its range).
	Expr, Bound string
	Swapped     bool
}

var opWords = map[string]string{"<": "less than", "<=": "at most", ">": "more than", ">=": "at least"}
var opInverse = map[string]string{"<": ">", "<=": ">=", ">": "<", ">=": "<="}

// Error reads "config: VAR=VALUE is out of range; allowed …", "config:
// VAR=VALUE is not an integer; allowed …" for a malformed one, "config:
// VAR is required; allowed …" when the value is empty (unset), and for a
// relation "config: VAR=V (set) must be more than OTHER=W (its default):
// WHY; change VAR or set OTHER".
func (e *RangeError) Error() string {
	switch {
	case e.Other != "":
		origin := func(o string) string {
			switch o {
			case "set":
				return " (set)"
			case "default":
				return " (its default)"
			}
			return ""
		}
		var msg string
		switch {
		case e.Expr != "" && e.Swapped:
			msg = fmt.Sprintf("config: %s=%s%s leaves %s=%s%s out of range: it must be %s %s = %s", e.Var, e.Value, origin(e.Origin),
				e.Other, e.OtherValue, origin(e.OtherOrigin), opWords[e.Op], e.Expr, e.Bound)
		case e.Expr != "":
			msg = fmt.Sprintf("config: %s=%s%s must be %s %s = %s (%s=%s%s)", e.Var, e.Value, origin(e.Origin), opWords[e.Op], e.Expr, e.Bound,
				e.Other, e.OtherValue, origin(e.OtherOrigin))
		default:
			msg = fmt.Sprintf("config: %s=%s%s must be %s %s=%s%s", e.Var, e.Value, origin(e.Origin), opWords[e.Op], e.Other, e.OtherValue, origin(e.OtherOrigin))
		}
		if e.Why != "" {
			msg += ": " + e.Why
		}
		if e.OtherOrigin == "set" {
			return msg + fmt.Sprintf("; change %s or %s", e.Var, e.Other)
		}
		return msg + fmt.Sprintf("; change %s or set %s", e.Var, e.Other)
	case e.Malformed && e.Allowed != "" && isInteger(e.Value):
		// an integer too large for its type: out of range, not malformed
		return fmt.Sprintf("config: %s=%s is out of range; allowed %s", e.Var, e.Value, e.Allowed)
	case e.Malformed:
		msg := fmt.Sprintf("config: %s=%s is not %s", e.Var, e.Value, cmp.Or(e.Wanted, e.Allowed))
		if e.Wanted != "" && e.Allowed != "" {
			msg += "; allowed " + e.Allowed
		}
		return msg
	case e.Value == "":
		return fmt.Sprintf("config: %s is required; allowed %s", e.Var, e.Allowed)
	}
	return fmt.Sprintf("config: %s=%s is out of range; allowed %s", e.Var, e.Value, e.Allowed)
}

// RelationBound is Relation against a bound derived from the variable
// other's value ov: v (of name) must be op bound, where expr shows how
// bound follows from other (e.g. "AURORA_RECONCILER_SETTLE_LAG_SECONDS +
// 3600"). Load names whichever of the two was set.
func RelationBound(name string, v int, op string, bound int, expr, other string, ov int, why string) error {
	ok := map[string]bool{"<": v < bound, "<=": v <= bound, ">": v > bound, ">=": v >= bound}[op]
	if ok {
		return nil
	}
	return &RangeError{Var: Prefix + name, Value: fmt.Sprint(v), Op: op, Other: Prefix + other, OtherValue: fmt.Sprint(ov), Why: why,
		Expr: expr, Bound: fmt.Sprint(bound), Allowed: fmt.Sprintf("%s %s = %d", opWords[op], expr, bound)}
}

func isInteger(v string) bool {
	v = strings.TrimPrefix(strings.TrimPrefix(v, "-"), "+")
	return v != "" && strings.Trim(v, "0123456789") == ""
}

// Relation returns a *RangeError when v (of the variable name) is not op
// ("<", "<=", ">", ">=") ov (of the variable other), nil when it is; why
// says what the relation protects. Judge a relation only between values
// that are each in range, so one mistake makes one error.
func Relation(name string, v int, op, other string, ov int, why string) error {
	ok := map[string]bool{"<": v < ov, "<=": v <= ov, ">": v > ov, ">=": v >= ov}[op]
	if ok {
		return nil
	}
	return &RangeError{Var: Prefix + name, Value: fmt.Sprint(v), Op: op, Other: Prefix + other, OtherValue: fmt.Sprint(ov), Why: why,
		Allowed: fmt.Sprintf("%s %s%s (%d)", opWords[op], Prefix, other, ov)}
}

// Unwrap returns ErrInvalid.
func (e *RangeError) Unwrap() error { return ErrInvalid }

// Validator is a configuration struct that checks its own ranges.
type Validator interface {
	Validate() error
}

// Load parses AURORA_* variables into dst (a pointer to a struct with env
// tags) and validates it. Parse errors and range errors wrap ErrInvalid.
func Load(dst Validator) error {
	return LoadFrom(dst, nil)
}

// LoadFrom is Load over an explicit environment (nil = the process's).
func LoadFrom(dst Validator, environ map[string]string) error {
	opts := env.Options{Prefix: Prefix}
	if environ != nil {
		opts.Environment = environ
	}
	if err := env.ParseWithOptions(dst, opts); err != nil {
		var agg env.AggregateError
		if errors.As(err, &agg) {
			for _, e := range agg.Errors {
				var pe env.ParseError
				if errors.As(e, &pe) {
					if tag := envTag(reflect.TypeOf(dst), pe.Name); tag != "" {
						return &RangeError{Var: Prefix + tag, Value: environValue(environ, Prefix+tag), Wanted: typeWanted(pe.Type),
							Allowed: allowedOf(dst, environ, Prefix+tag, pe.Type), Malformed: true}
					}
				}
			}
		}
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	err := dst.Validate()
	blameWhatWasSet(err, environ)
	return err
}

// allowedOf finds the range of the integer variable key that did not
// parse: it loads a fresh dst with key at the integer's extreme and takes
// the Allowed of Validate's error for key ("" when none names it).
func allowedOf(dst Validator, environ map[string]string, key string, t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
	default:
		return ""
	}
	m := environMap(environ)
	bits := t.Bits()
	if t.Kind() == reflect.Int {
		bits = 32 // env parses int as 32 bits
	}
	probe := strconv.FormatInt(math.MaxInt64>>(64-bits), 10)
	if strings.HasPrefix(strings.TrimSpace(m[key]), "-") {
		probe = strconv.FormatInt(math.MinInt64>>(64-bits), 10)
	}
	m[key] = probe
	fresh, ok := reflect.New(reflect.TypeOf(dst).Elem()).Interface().(Validator)
	if !ok {
		return ""
	}
	if env.ParseWithOptions(fresh, env.Options{Prefix: Prefix, Environment: m}) != nil {
		return ""
	}
	for _, e := range rangeErrors(fresh.Validate()) {
		if e.Var == key && e.Other == "" {
			return e.Allowed
		}
	}
	return ""
}

// blameWhatWasSet marks each relation error's variables as set or
// defaulted and, when only the other one was set, names that one first:
// the message then blames what the user changed.
func blameWhatWasSet(err error, environ map[string]string) {
	for _, e := range rangeErrors(err) {
		if e.Other == "" {
			continue
		}
		origin := func(k string) string {
			if v, ok := lookupEnv(environ, k); ok && strings.TrimSpace(v) != "" {
				return "set"
			}
			return "default"
		}
		e.Origin, e.OtherOrigin = origin(e.Var), origin(e.Other)
		if e.Origin == "default" && e.OtherOrigin == "set" && e.Expr != "" {
			e.Var, e.Other = e.Other, e.Var
			e.Value, e.OtherValue = e.OtherValue, e.Value
			e.Origin, e.OtherOrigin = e.OtherOrigin, e.Origin
			e.Swapped = true
			continue
		}
		if e.Origin == "default" && e.OtherOrigin == "set" {
			e.Var, e.Other = e.Other, e.Var
			e.Value, e.OtherValue = e.OtherValue, e.Value
			e.Origin, e.OtherOrigin = e.OtherOrigin, e.Origin
			e.Op = opInverse[e.Op]
			e.Allowed = fmt.Sprintf("%s %s (%s)", opWords[e.Op], e.Other, e.OtherValue)
		}
	}
}

// rangeErrors lists the *RangeError in err, through joins and wraps.
func rangeErrors(err error) []*RangeError {
	if err == nil {
		return nil
	}
	if re, ok := err.(*RangeError); ok {
		return []*RangeError{re}
	}
	var out []*RangeError
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			out = append(out, rangeErrors(e)...)
		}
	case interface{ Unwrap() error }:
		out = rangeErrors(u.Unwrap())
	}
	return out
}

func lookupEnv(environ map[string]string, key string) (string, bool) {
	if environ != nil {
		v, ok := environ[key]
		return v, ok
	}
	return os.LookupEnv(key)
}

// environMap copies environ, or the process's AURORA_* variables when nil.
func environMap(environ map[string]string) map[string]string {
	m := map[string]string{}
	if environ != nil {
		for k, v := range environ {
			m[k] = v
		}
		return m
	}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, Prefix) {
			m[k] = v
		}
	}
	return m
}

// typeWanted names what a variable of type t must look like.
func typeWanted(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	default:
		return "a value of type " + t.String()
	}
}

// envTag finds the env tag of the field named name anywhere in t.
func envTag(t reflect.Type, name string) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return ""
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Name == name {
			if tag, _, _ := strings.Cut(f.Tag.Get("env"), ","); tag != "" {
				return tag
			}
		}
		if f.Type.Kind() == reflect.Struct {
			if tag := envTag(f.Type, name); tag != "" {
				return tag
			}
		}
	}
	return ""
}

func environValue(environ map[string]string, key string) string {
	if environ != nil {
		return environ[key]
	}
	return os.Getenv(key)
}

// IntRange returns a *RangeError when v is outside [lo, hi].
func IntRange(name string, v, lo, hi int, unit string) error {
	if v < lo || v > hi {
		allowed := fmt.Sprintf("%d..%d", lo, hi)
		if unit != "" {
			allowed += " (" + unit + ")"
		}
		return &RangeError{Var: Prefix + name, Value: fmt.Sprint(v), Allowed: allowed}
	}
	return nil
}

// OneOf returns a *RangeError when v is not in allowed.
func OneOf(name, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return &RangeError{Var: Prefix + name, Value: v, Allowed: strings.Join(allowed, "|")}
}

// ListenAddr returns a *RangeError when v is not a TCP listen address:
// host:port or :port with a numeric port in 0..65535 (0 picks a free port).
// An empty v is accepted only when optional is true (the listener is off).
func ListenAddr(name, v string, optional bool) error {
	allowed := "host:port or :port, port 0..65535"
	if optional {
		allowed += ", or empty (off)"
	}
	if v == "" && optional {
		return nil
	}
	if _, port, err := net.SplitHostPort(v); err == nil {
		if n, err := strconv.Atoi(port); err == nil && n >= 0 && n <= 65535 {
			return nil
		}
	}
	return &RangeError{Var: Prefix + name, Value: v, Allowed: allowed}
}

// URL returns a *RangeError when v is not an absolute URL with one of the
// schemes.
func URL(name, v string, schemes ...string) error {
	u, err := url.Parse(v)
	if err == nil && u.Host != "" {
		for _, s := range schemes {
			if u.Scheme == s {
				return nil
			}
		}
	}
	// A value that does not parse cannot be redacted part by part: it is
	// hidden whole, since it may hold a password (found by FuzzConfigLoad).
	shown := "(unparseable URL, redacted)"
	if err == nil {
		shown = u.Redacted()
	}
	return &RangeError{Var: Prefix + name, Value: shown, Allowed: "a URL with scheme " + strings.Join(schemes, "|")}
}

// Database is the Postgres connection.
type Database struct {
	// URL of Postgres. AURORA_DATABASE_URL; defaults to the local server
	// over loopback without TLS (sslmode=disable): pgx's default "prefer"
	// negotiated TLS with a local server, ~6 % of the demo's CPU on both
	// sides for a connection that never leaves the machine. A URL you set
	// is used as given.
	URL string `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/test?sslmode=disable"`
	// Session bounds of every pooled connection (database_session.go):
	// AURORA_DATABASE_STATEMENT_TIMEOUT_MS, AURORA_DATABASE_LOCK_TIMEOUT_MS,
	// AURORA_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS.
	Session DatabaseSession
}

// Validate checks the URL's shape and the session bounds.
func (d Database) Validate() error {
	return errors.Join(URL("DATABASE_URL", d.URL, "postgres", "postgresql"), d.Session.Validate())
}

// NATS is the JetStream connection.
type NATS struct {
	// URL of NATS. AURORA_NATS_URL; defaults to the local server.
	URL string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
}

// Validate checks the URL's shape.
func (n NATS) Validate() error { return URL("NATS_URL", n.URL, "nats", "tls", "ws", "wss") }

// Outbox holds seed 000's knobs.
type Outbox struct {
	// LeaseSeconds: how long a claim lives before the item is claimable
	// again (liveness only; fencing is lease_token). Default 120, 5..3600.
	LeaseSeconds int `env:"OUTBOX_LEASE_SECONDS" envDefault:"120"`
	// MaxAttempts: attempts after which a retryable failure becomes
	// uncertain. Default 20, 1..1000.
	MaxAttempts int `env:"OUTBOX_MAX_ATTEMPTS" envDefault:"20"`
	// BatchSize: rows per claim/publish batch. Default 100, 1..1000.
	BatchSize int `env:"OUTBOX_BATCH_SIZE" envDefault:"100"`
	// BackoffBaseSeconds: first retry delay. Default 5, 1..3600.
	BackoffBaseSeconds int `env:"OUTBOX_BACKOFF_BASE_SECONDS" envDefault:"5"`
	// BackoffCapSeconds: largest retry delay. Default 900, base..86400.
	BackoffCapSeconds int `env:"OUTBOX_BACKOFF_CAP_SECONDS" envDefault:"900"`
	// UncertaintyHorizonSeconds: time since the first attempt after which a
	// retry would leave Stripe's ≥ 24 h idempotency window, so the item
	// becomes uncertain without sending. Default 82800 (23 h), 60..86399.
	UncertaintyHorizonSeconds int `env:"UNCERTAINTY_HORIZON_SECONDS" envDefault:"82800"`
}

// Validate checks every knob's range. A horizon ≥ 86400 s is refused: it
// would outlive Stripe's idempotency window and turn retries into new work.
func (o Outbox) Validate() error {
	base := IntRange("OUTBOX_BACKOFF_BASE_SECONDS", o.BackoffBaseSeconds, 1, 3600, "seconds")
	capErr := IntRange("OUTBOX_BACKOFF_CAP_SECONDS", o.BackoffCapSeconds, 1, 86400, "seconds")
	if base == nil && capErr == nil {
		capErr = Relation("OUTBOX_BACKOFF_CAP_SECONDS", o.BackoffCapSeconds, ">=", "OUTBOX_BACKOFF_BASE_SECONDS", o.BackoffBaseSeconds,
			"the largest retry delay cannot be below the first")
	}
	return errors.Join(
		IntRange("OUTBOX_LEASE_SECONDS", o.LeaseSeconds, 5, 3600, "seconds"),
		IntRange("OUTBOX_MAX_ATTEMPTS", o.MaxAttempts, 1, 1000, ""),
		IntRange("OUTBOX_BATCH_SIZE", o.BatchSize, 1, 1000, "rows"),
		base, capErr,
		IntRange("UNCERTAINTY_HORIZON_SECONDS", o.UncertaintyHorizonSeconds, 60, 86399, "seconds, below Stripe's 24 h idempotency window"),
	)
}

// Export names where usage goes by default.
type Export struct {
	// StripeAccount: destination account of staged items. AURORA_STRIPE_ACCOUNT,
	// default "acct_aurora_local".
	StripeAccount string `env:"STRIPE_ACCOUNT" envDefault:"acct_aurora_local"`
	// StripeMode: test|live. AURORA_STRIPE_MODE, default test.
	StripeMode string `env:"STRIPE_MODE" envDefault:"test"`
	// UsagePeriod: hour|day|month, the period a quantity is counted in.
	// AURORA_USAGE_PERIOD, default day.
	UsagePeriod string `env:"USAGE_PERIOD" envDefault:"day"`
}

// Validate checks the account (field.Text), the mode and the period.
func (e Export) Validate() error {
	var acct error
	if r := field.Text(e.StripeAccount, field.MaxStripeIDBytes); r != "" {
		// every staged item carries the account: it must be text Postgres
		// can hold (found by FuzzConfigLoad); the value is not quoted
		acct = &RangeError{Var: Prefix + "STRIPE_ACCOUNT", Value: "(refused: " + r + ")", Allowed: "a Stripe account id: not blank, valid UTF-8, no control characters, at most 255 bytes"}
	}
	return errors.Join(acct,
		OneOf("STRIPE_MODE", e.StripeMode, "test", "live"),
		OneOf("USAGE_PERIOD", e.UsagePeriod, "hour", "day", "month"))
}

// RedactURL returns raw with its secrets hidden, for printing and logging: the
// user-info password and every query parameter whose name mentions a
// password, secret, token or key (e.g. Postgres's ?password=…) become "xxxxx".
// A value that does not parse as a URL is replaced whole.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL, redacted)"
	}
	q := u.Query()
	changed := false
	for k := range q {
		lk := strings.ToLower(k)
		if strings.Contains(lk, "pass") || strings.Contains(lk, "secret") || strings.Contains(lk, "token") || strings.Contains(lk, "key") {
			q.Set(k, "xxxxx")
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
