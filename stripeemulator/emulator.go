package stripeemulator

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of Config.
const (
	// DedupeWindowDefault: Stripe enforces identifier uniqueness "within a
	// rolling 24 hour period" (stripe-go BillingMeterEventParams.Identifier).
	DedupeWindowDefault = 24 * time.Hour
	// IdempotencyTTLDefault: Stripe keeps idempotency keys at least 24 h.
	IdempotencyTTLDefault = 24 * time.Hour
	// CancelWindowDefault: "You can only cancel events within 24 hours of
	// Stripe receiving them" (BillingMeterEventAdjustmentCancelParams).
	CancelWindowDefault = 24 * time.Hour
	// MaxPastDefault: meter event timestamps within the past 35 days.
	MaxPastDefault = 35 * 24 * time.Hour
	// MaxFutureDefault: meter event timestamps at most 5 minutes ahead.
	MaxFutureDefault = 5 * time.Minute
	// TimeoutHoldDefault: how long a "timeout" answer holds a request when
	// the client does not give up first; above stripe-go's 80 s default.
	TimeoutHoldDefault = 90 * time.Second
	// RequestLogLimitDefault: request records kept by Requests().
	RequestLogLimitDefault = 10_000
	// DefaultAPIVersion is answered in Stripe-Version when the request has
	// none (stripe-go v76's pinned version).
	DefaultAPIVersion = "2023-10-16"
	// maxBodyBytes caps a request body.
	maxBodyBytes = 64 << 10
)

// Access is what an API key may do.
type Access int

const (
	// AccessFull: every endpoint.
	AccessFull Access = iota
	// AccessDenied: authenticates, but every endpoint answers 403 (a
	// restricted key lacking permission).
	AccessDenied
)

// Config configures an Emulator. The zero value is usable: open keys, real
// clock, no faults, Stripe's windows.
type Config struct {
	// Keys maps each accepted API key to its access. Nil or empty: open
	// mode, any key starting with sk_test_, rk_test_, sk_live_ or rk_live_
	// is accepted with AccessFull. A key not accepted is 401.
	Keys map[string]Access
	// Now is the clock for the timestamp window, dedupe, idempotency and
	// cancel windows and `created` fields. Defaults to time.Now.
	Now func() time.Time
	// Faults injected into meter event requests. Defaults to none.
	Faults Faults
	// Seed of fault decisions and generated ids. Defaults to 0.
	Seed uint64
	// DedupeWindow: how long an identifier stays unique. Defaults to
	// DedupeWindowDefault (24 h).
	DedupeWindow time.Duration
	// IdempotencyTTL: how long a saved idempotent result is replayed.
	// Defaults to IdempotencyTTLDefault (24 h).
	IdempotencyTTL time.Duration
	// CancelWindow: how long after receipt an event can be cancelled.
	// Defaults to CancelWindowDefault (24 h).
	CancelWindow time.Duration
	// MaxPast, MaxFuture: the timestamp window. Default 35 days, 5 minutes.
	MaxPast, MaxFuture time.Duration
	// TimeoutHold: the longest a "timeout" answer holds a request. Defaults
	// to TimeoutHoldDefault (90 s).
	TimeoutHold time.Duration
	// AsyncValidation answers configuration causes (no_meter,
	// archived_meter, meter_event_customer_not_found, …, timestamp window)
	// as Stripe does: 200 now, the event not applied, and an ErrorReport
	// (what Stripe sends as v1.billing.meter.error_report_triggered).
	// Defaults to false: a synchronous 400 with the same code.
	AsyncValidation bool
	// AllowConcurrent turns off live mode's one-concurrent-call-per-
	// (customer, meter) rule. Defaults to false (enforced).
	AllowConcurrent bool
	// BeforeExecute, when set, is called with the identifier as a meter
	// event starts executing: its (customer, meter) slot is held and its
	// Idempotency-Key is running. Blocking in it holds the call in flight,
	// so tests can stage overlaps, lease takeovers and key-in-use answers
	// without timing. Defaults to nil.
	BeforeExecute func(identifier string)
	// RequestLogLimit: request records kept (oldest dropped first).
	// Defaults to RequestLogLimitDefault.
	RequestLogLimit int
	// SessionTTL: how long a v2 meter event session token is valid.
	// Defaults to SessionTTLDefault (15 minutes).
	SessionTTL time.Duration
	// SessionExpiredStatus: the HTTP status of the stream's
	// billing_meter_event_session_expired answer, 401 (Stripe's spec,
	// the default) or 400 (as some Stripe SDK tests have it).
	SessionExpiredStatus int
	// Reconcile: summary lag, error report delivery, invoice grace
	// (reconcile.go).
	Reconcile ReconcileConfig
}

func (c *Config) setDefaults() {
	if c.Now == nil {
		c.Now = time.Now
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.DedupeWindow, DedupeWindowDefault)
	def(&c.IdempotencyTTL, IdempotencyTTLDefault)
	def(&c.CancelWindow, CancelWindowDefault)
	def(&c.MaxPast, MaxPastDefault)
	def(&c.MaxFuture, MaxFutureDefault)
	def(&c.TimeoutHold, TimeoutHoldDefault)
	def(&c.SessionTTL, SessionTTLDefault)
	if c.SessionExpiredStatus == 0 {
		c.SessionExpiredStatus = http.StatusUnauthorized
	}
	if c.RequestLogLimit == 0 {
		c.RequestLogLimit = RequestLogLimitDefault
	}
}

// Validate checks the durations (non-negative), RequestLogLimit
// (non-negative) and Faults. Errors wrap ErrInvalidConfig or are a
// *FaultSpecError.
func (c Config) Validate() error {
	for name, d := range map[string]time.Duration{
		"DedupeWindow": c.DedupeWindow, "IdempotencyTTL": c.IdempotencyTTL, "CancelWindow": c.CancelWindow,
		"MaxPast": c.MaxPast, "MaxFuture": c.MaxFuture, "TimeoutHold": c.TimeoutHold, "SessionTTL": c.SessionTTL,
	} {
		if d < 0 {
			return fmt.Errorf("%w: %s=%s must not be negative", ErrInvalidConfig, name, d)
		}
	}
	if s := c.SessionExpiredStatus; s != 0 && s != http.StatusUnauthorized && s != http.StatusBadRequest {
		return fmt.Errorf("%w: SessionExpiredStatus=%d must be 401 or 400", ErrInvalidConfig, s)
	}
	if c.RequestLogLimit < 0 {
		return fmt.Errorf("%w: RequestLogLimit=%d must not be negative", ErrInvalidConfig, c.RequestLogLimit)
	}
	return c.Faults.Validate()
}

// Emulator is the emulated Stripe account. Create with New; it is an
// http.Handler and safe for concurrent use.
type Emulator struct {
	cfg Config
	mux *http.ServeMux

	mu  sync.Mutex
	rng *rand.Rand
	// generation counts LoadState calls (state.go): the id stream in use.
	generation uint64
	faults     Faults
	customers  map[string]*customer
	custOrder  []string
	meters     map[string]*Meter
	meterList  []string // ids, creation order
	byEvent    map[string]*Meter

	events     []AppliedEvent
	ids        map[string]idState // per identifier; never pruned (the oracle), bounded per identifier
	duplicates []string           // identifiers applied more than once, in order of the 2nd application
	byPair     map[pairKey][]int
	reports    []ErrorReport

	idem      map[[32]byte]*idemEntry
	idemQueue []idemQueued

	inflight     map[pairKey]int
	inflightN    int                 // sum of inflight
	executingN   int                 // idem entries running
	cancelledN   int                 // applied events cancelled
	totals       map[string]*big.Rat // AppliedTotals, kept exactly as events apply and cancel
	overlaps     int
	overlapsPair map[pairKey]int

	scripts map[string][]Answer

	sessions     map[string]session // v2 meter event session tokens (stream.go)
	sessionsN    int                // sessions created
	streamEvents int                // events received by the stream (processed requests)
	streamDupes  int                // of which not applied again: identifier within the dedupe window

	rec  reconState // reconcile.go
	told told       // objects.go

	counts   map[Outcome]int
	requests []RequestRecord
	seq      uint64
}

type pairKey struct{ meter, customer string }

// idState is what the emulator keeps per meter event identifier.
type idState struct {
	applications int // times applied
	last         int // index in events of the latest application; valid when applications > 0
	attempts     int // meter event requests seen (drives fault draws)
}

type idemEntry struct {
	fingerprint [32]byte
	running     bool
	status      int
	body        []byte
	requestID   string
	at          time.Time
}

type idemQueued struct {
	key [32]byte
	at  time.Time
}

// New returns an emulator with no customers and no meters. It returns
// Config.Validate's error for a bad configuration.
func New(cfg Config) (*Emulator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	e := &Emulator{
		cfg:          cfg,
		rng:          rand.New(rand.NewPCG(cfg.Seed, 0x5eed_57a1_9e)),
		faults:       cfg.Faults,
		customers:    map[string]*customer{},
		meters:       map[string]*Meter{},
		byEvent:      map[string]*Meter{},
		ids:          map[string]idState{},
		byPair:       map[pairKey][]int{},
		idem:         map[[32]byte]*idemEntry{},
		inflight:     map[pairKey]int{},
		totals:       map[string]*big.Rat{},
		overlapsPair: map[pairKey]int{},
		scripts:      map[string][]Answer{},
		sessions:     map[string]session{},
		counts:       map[Outcome]int{},
	}
	e.initReconcile()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/customers", e.authed(RouteCustomerCreate, e.handleCustomerCreate))
	mux.HandleFunc("GET /v1/customers/{id}", e.authed(RouteCustomerGet, e.handleCustomerGet))
	mux.HandleFunc("DELETE /v1/customers/{id}", e.authed(RouteCustomerDelete, e.handleCustomerDelete))
	mux.HandleFunc("POST /v1/billing/meters", e.authed(RouteMeterCreate, e.handleMeterCreate))
	mux.HandleFunc("GET /v1/billing/meters", e.authed(RouteMeterList, e.handleMeterList))
	mux.HandleFunc("GET /v1/billing/meters/{id}", e.authed(RouteMeterGet, e.handleMeterGet))
	mux.HandleFunc("POST /v1/billing/meters/{id}/deactivate", e.authed(RouteMeterDeactivate, e.handleMeterDeactivate))
	mux.HandleFunc("POST /v1/billing/meters/{id}/reactivate", e.authed(RouteMeterReactivate, e.handleMeterReactivate))
	mux.HandleFunc("GET /v1/billing/meters/{id}/event_summaries", e.authed(RouteSummaryList, e.handleSummaryList))
	mux.HandleFunc("POST /v1/billing/meter_events", e.authed(RouteMeterEventCreate, e.handleMeterEventCreate))
	mux.HandleFunc("POST /v1/billing/meter_event_adjustments", e.authed(RouteAdjustmentCreate, e.handleAdjustmentCreate))
	e.registerStream(mux)
	e.registerControl(mux)
	e.registerReconcile(mux)
	e.registerObjects(mux)
	mux.HandleFunc("/", e.authed(RouteUnknown, e.handleUnknown))
	e.mux = mux
	return e, nil
}

// ServeHTTP serves the emulated API. The drop, cut-after-apply and timeout
// answers close the client's connection: they hijack it under an HTTP/1.x
// net/http server, and otherwise (HTTP/2, a ResponseRecorder) abort the
// handler with panic(http.ErrAbortHandler), which net/http's server turns
// into a reset stream. Every other answer is written normally.
func (e *Emulator) ServeHTTP(w http.ResponseWriter, r *http.Request) { e.mux.ServeHTTP(w, r) }

// Route names one endpoint in RequestRecord.
type Route string

// Routes, as registered on the ServeMux (RouteUnknown: anything else).
const (
	RouteCustomerCreate   Route = "POST /v1/customers"
	RouteCustomerGet      Route = "GET /v1/customers/{id}"
	RouteCustomerDelete   Route = "DELETE /v1/customers/{id}"
	RouteMeterCreate      Route = "POST /v1/billing/meters"
	RouteMeterList        Route = "GET /v1/billing/meters"
	RouteMeterGet         Route = "GET /v1/billing/meters/{id}"
	RouteMeterDeactivate  Route = "POST /v1/billing/meters/{id}/deactivate"
	RouteMeterReactivate  Route = "POST /v1/billing/meters/{id}/reactivate"
	RouteSummaryList      Route = "GET /v1/billing/meters/{id}/event_summaries"
	RouteMeterEventCreate Route = "POST /v1/billing/meter_events"
	RouteAdjustmentCreate Route = "POST /v1/billing/meter_event_adjustments"
	RouteUnknown          Route = "unknown"
)

// call is one request in flight: what the handlers need and what gets
// recorded.
type call struct {
	w          http.ResponseWriter
	r          *http.Request
	route      Route
	apiKey     string
	livemode   bool
	requestID  string
	received   time.Time
	form       url.Values
	bodySum    [32]byte
	identifier string
	// identifiers: every event identifier of a stream request.
	identifiers []string
	idemKey     string
	done        bool
}

// reply is one answer to write.
type reply struct {
	status  int
	body    []byte
	header  map[string]string
	outcome Outcome
}

func jsonReply(status int, v any, outcome Outcome) reply {
	b, err := json.Marshal(v)
	if err != nil { // only our own types are marshalled; keep the promise of a JSON body anyway
		return errReply(&apiError{Status: http.StatusInternalServerError, Type: TypeAPIError, Message: "emulator: cannot encode response"}, OutcomeServerError)
	}
	return reply{status: status, body: b, outcome: outcome}
}

func errReply(ae *apiError, outcome Outcome) reply {
	rp := reply{status: ae.Status, body: ae.body(), outcome: outcome}
	if ae.ShouldRetry != "" {
		rp.header = map[string]string{"Stripe-Should-Retry": ae.ShouldRetry}
	}
	return rp
}

// authed wraps a handler with request ids, auth, body parsing and recording.
func (e *Emulator) authed(route Route, h func(*call) reply) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := &call{w: w, r: r, route: route}
		e.mu.Lock()
		c.requestID = e.newID("req_", 14)
		c.received = e.cfg.Now()
		e.mu.Unlock()
		c.idemKey = strings.TrimSpace(r.Header.Get("Idempotency-Key"))
		if rp, ok := e.authenticate(c); !ok {
			e.finish(c, rp)
			return
		}
		if rp, ok := e.parseForm(c); !ok {
			e.finish(c, rp)
			return
		}
		rp := h(c)
		if !c.done {
			e.finish(c, rp)
		}
	}
}

// authenticate checks `Authorization: Bearer <key>` (or HTTP basic with the
// key as user name, as Stripe accepts).
func (e *Emulator) authenticate(c *call) (reply, bool) {
	key := ""
	if h := c.r.Header.Get("Authorization"); h != "" {
		if k, ok := strings.CutPrefix(h, "Bearer "); ok {
			key = strings.TrimSpace(k)
		} else if u, _, ok := c.r.BasicAuth(); ok {
			key = u
		}
	}
	if key == "" {
		return errReply(&apiError{Status: http.StatusUnauthorized, Type: TypeInvalidRequestError,
			Message: "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY')."}, OutcomeUnauthorized), false
	}
	access, ok := e.lookupKey(key)
	if !ok {
		return errReply(&apiError{Status: http.StatusUnauthorized, Type: TypeInvalidRequestError,
			Message: "Invalid API Key provided: " + redactKey(key)}, OutcomeUnauthorized), false
	}
	if access == AccessDenied {
		return errReply(&apiError{Status: http.StatusForbidden, Type: TypeInvalidRequestError,
			Message: "The provided key '" + redactKey(key) + "' does not have the required permissions for this endpoint."}, OutcomeForbidden), false
	}
	c.apiKey = key
	c.livemode = strings.HasPrefix(key, "sk_live_") || strings.HasPrefix(key, "rk_live_")
	return reply{}, true
}

func (e *Emulator) lookupKey(key string) (Access, bool) {
	if len(e.cfg.Keys) == 0 {
		for _, p := range []string{"sk_test_", "rk_test_", "sk_live_", "rk_live_"} {
			if strings.HasPrefix(key, p) && len(key) > len(p) {
				return AccessFull, true
			}
		}
		return 0, false
	}
	a, ok := e.cfg.Keys[key]
	return a, ok
}

// redactKey shows a key as Stripe does: prefix, stars, last four.
func redactKey(k string) string {
	if len(k) <= 12 {
		return strings.Repeat("*", len(k))
	}
	i := strings.LastIndexByte(k[:8], '_') + 1
	return k[:i] + strings.Repeat("*", len(k)-i-4) + k[len(k)-4:]
}

// parseForm reads the form-encoded body (POST, ≤ 64 KiB) or the query (GET,
// DELETE).
func (e *Emulator) parseForm(c *call) (reply, bool) {
	raw := c.r.URL.RawQuery
	if c.r.Method == http.MethodPost {
		buf, err := io.ReadAll(http.MaxBytesReader(c.w, c.r.Body, maxBodyBytes))
		if err != nil {
			return errReply(invalidRequest("", "", "Could not read the request body (at most %d bytes of application/x-www-form-urlencoded).", maxBodyBytes), OutcomeInvalid), false
		}
		c.bodySum = sha256.Sum256(buf)
		raw = string(buf)
	}
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return errReply(invalidRequest("", "", "Invalid request body: %s", "could not decode application/x-www-form-urlencoded parameters"), OutcomeInvalid), false
	}
	c.form = vals
	return reply{}, true
}

// finish writes rp and records the request.
func (e *Emulator) finish(c *call, rp reply) {
	c.done = true
	h := c.w.Header()
	h.Set("Request-Id", c.requestID)
	v := c.r.Header.Get("Stripe-Version")
	if v == "" {
		v = DefaultAPIVersion
	}
	h.Set("Stripe-Version", v)
	if c.idemKey != "" {
		h.Set("Idempotency-Key", c.idemKey)
	}
	for k, val := range rp.header {
		h.Set(k, val)
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(rp.body)))
	c.w.WriteHeader(rp.status)
	_, _ = c.w.Write(rp.body) // a client that went away is not our error
	e.record(c, rp.status, rp.outcome)
}

// abort closes the connection without writing a response: hijack and close
// on HTTP/1.x, http.ErrAbortHandler otherwise.
func (e *Emulator) abort(c *call, outcome Outcome) {
	c.done = true
	e.record(c, 0, outcome)
	if hj, ok := c.w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// cut sends rp's status line, headers and the first half of its body, then
// closes the connection: a response every client sees as broken.
func (e *Emulator) cut(c *call, rp reply) {
	c.done = true
	e.record(c, 0, OutcomeDropped)
	hj, ok := c.w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	defer conn.Close()
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nRequest-Id: %s\r\n\r\n",
		rp.status, http.StatusText(rp.status), len(rp.body), c.requestID)
	_, _ = buf.Write(rp.body[:len(rp.body)/2])
	_ = buf.Flush() // the peer may be gone; the connection closes either way
}

func (e *Emulator) handleUnknown(c *call) reply {
	return errReply(notFound("", "Unrecognized request URL (%s: %s). Please see https://stripe.com/docs or we can help at https://support.stripe.com/.", c.r.Method, c.r.URL.Path), OutcomeInvalid)
}

// newID returns prefix + n base62 characters from the seeded generator.
// Callers hold e.mu.
func (e *Emulator) newID(prefix string, n int) string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	b := make([]byte, len(prefix)+n)
	copy(b, prefix)
	for i := len(prefix); i < len(b); i++ {
		b[i] = alphabet[e.rng.IntN(len(alphabet))]
	}
	return string(b)
}

// SetFaults replaces the random faults from now on. It returns the
// *FaultSpecError of Faults.Validate.
func (e *Emulator) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	e.mu.Lock()
	e.faults = f
	e.mu.Unlock()
	return nil
}

// Script queues answers for the next meter event requests carrying
// identifier, consumed one per request in order (requests refused by the
// concurrency limiter consume none), ahead of random faults.
// When the queue is empty requests are answered normally (random faults
// apply again).
func (e *Emulator) Script(identifier string, answers ...Answer) {
	e.mu.Lock()
	e.scripts[identifier] = append(e.scripts[identifier], answers...)
	e.mu.Unlock()
}

// ForgetIdempotencyKeys drops every saved idempotent result, as Stripe does
// once a key is older than its retention (≥ 24 h), while identifiers stay
// deduplicated. A resend with the same key is then answered by the
// identifier rule (Stripe's duplicate 400) instead of a replay.
func (e *Emulator) ForgetIdempotencyKeys() {
	e.mu.Lock()
	for k, en := range e.idem {
		if !en.running {
			delete(e.idem, k)
		}
	}
	e.idemQueue = nil
	e.mu.Unlock()
}
