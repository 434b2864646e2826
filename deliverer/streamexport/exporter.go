package streamexport

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aurora-billing/aurora/deliverer"
	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
)

// Action is what one stream answer makes the exporter do with its batch.
type Action string

const (
	// ActAccept: every event of the batch is accepted (provisional: Stripe
	// validates asynchronously; the reconciler confirms or finds it).
	ActAccept Action = "accepted (every event)"
	// ActNewSession: a new session, then the same batch resent with the same
	// identifiers; never quarantined or rejected for it.
	ActNewSession Action = "new session, same batch resent"
	// ActRetry: every event gets a retry outcome; the deliverer applies the
	// v1 backoff, attempts and horizon rules per item.
	ActRetry Action = "retry (per item)"
	// ActSplit: the batch is split in halves and each half resent, down to
	// the one event at fault, whose answer the v1 table classifies.
	ActSplit Action = "split to find the event at fault"
	// ActPerItem: every event gets the v1 table's outcome for this answer.
	ActPerItem Action = "v1 table per item"
	// ActUncertain: every event is uncertain.
	ActUncertain Action = "uncertain (per item)"
)

// Rule is one row of the stream's outcome table: the first row whose Match
// holds decides.
type Rule struct {
	Name   string
	When   string
	Action Action
	Why    string
	Match  func(stripeexport.Answer) bool
}

// Rules returns the stream's outcome table in match order (docs/deliverer.md
// renders it, TestDocsTable keeps them equal).
func Rules() []Rule {
	return []Rule{
		{Name: "timeout", When: "no answer before the deadline", Action: ActRetry,
			Why:   "it may have applied; the resend carries the same identifiers, which Stripe deduplicates for 24 h",
			Match: func(a stripeexport.Answer) bool { return a.Status == 0 && a.Transport == stripeexport.TransportTimeout }},
		{Name: "connection_error", When: "connection refused, reset or dropped (also after Stripe applied the batch), or a body cut short", Action: ActRetry,
			Why: "same as timeout", Match: func(a stripeexport.Answer) bool { return a.Status == 0 }},
		{Name: "http_2xx", When: "200 `{}` (any 2xx)", Action: ActAccept,
			Why:   "Stripe took the batch; validation is asynchronous, so each event is accepted until the reconciler confirms it or names it in an error report",
			Match: func(a stripeexport.Answer) bool { return a.Status >= 200 && a.Status < 300 }},
		{Name: "session_expired", When: "401, or 400, with code " + "`billing_meter_event_session_expired`", Action: ActNewSession,
			Why: "the token is 15 minutes old (the spec says 401, an SDK's tests 400); nothing was processed",
			Match: func(a stripeexport.Answer) bool {
				return (a.Status == 401 || a.Status == 400) && a.Code == "billing_meter_event_session_expired"
			}},
		{Name: "token_refused", When: "any other 401", Action: ActNewSession,
			Why:   "the token is not (or no longer) known; one new session, then a second 401 goes to the v1 table (quarantined account_unconfirmed)",
			Match: func(a stripeexport.Answer) bool { return a.Status == 401 }},
		{Name: "rate_limited", When: "429", Action: ActRetry,
			Why: "nothing was processed; backoff per item", Match: func(a stripeexport.Answer) bool { return a.Status == 429 }},
		{Name: "conflict", When: "409", Action: ActRetry,
			Why: "a concurrent request; nothing was processed", Match: func(a stripeexport.Answer) bool { return a.Status == 409 }},
		{Name: "server_error", When: "500–599", Action: ActRetry,
			Why:   "Stripe failed; whatever it applied is deduplicated by identifier on the resend",
			Match: func(a stripeexport.Answer) bool { return a.Status >= 500 && a.Status <= 599 }},
		{Name: "forbidden", When: "403", Action: ActPerItem,
			Why: "the key may not use the stream: the account's problem, not the events' (quarantined account_unconfirmed)", Match: func(a stripeexport.Answer) bool { return a.Status == 403 }},
		{Name: "endpoint_missing", When: "404", Action: ActPerItem,
			Why: "no stream endpoint at the configured host: configuration, not any event (the v1 table: 404 → rejected, or the cause Stripe names)", Match: func(a stripeexport.Answer) bool { return a.Status == 404 }},
		{Name: "request_invalid", When: "400 (any other code), 413, or any other 4xx", Action: ActSplit,
			Why:   "Stripe refused the request for something in it: halves are resent until the one event at fault is alone, never a whole batch quarantined for one event",
			Match: func(a stripeexport.Answer) bool { return a.Status >= 400 && a.Status <= 499 }},
		{Name: "unexpected", When: "anything else (1xx, 3xx)", Action: ActUncertain,
			Why: "an answer we cannot read: nobody knows whether it landed", Match: func(stripeexport.Answer) bool { return true }},
	}
}

// Classify returns the first rule of Rules that matches a.
func Classify(a stripeexport.Answer) Rule {
	for _, r := range Rules() {
		if r.Match(a) {
			return r
		}
	}
	panic("streamexport: the table's last rule matches everything")
}

// MarkdownTable renders Rules as in docs/deliverer.md.
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| # | rule | stream answer | the batch | why |\n|---|---|---|---|---|\n")
	for i, r := range Rules() {
		fmt.Fprintf(&b, "| %d | `%s` | %s | %s | %s |\n", i+1, r.Name, r.When, r.Action, r.Why)
	}
	return b.String()
}

// Defaults and bounds of Config.Linger.
const (
	// DefaultLinger: how long a request waits for more lanes' events
	// before it goes out less than full.
	DefaultLinger = 2 * time.Millisecond
	// MaxLinger bounds Config.Linger.
	MaxLinger = 100 * time.Millisecond
)

// Config configures an Exporter.
type Config struct {
	Client ClientConfig
	// Senders: stream requests in flight per account (default 8).
	Senders int
	// MaxBatch: events per request, 1..MaxEvents (default MaxEvents).
	MaxBatch int
	// Linger: how long a request that is not full waits for more events
	// once it has its first, 0 < Linger ≤ MaxLinger (0: DefaultLinger). A
	// request also waits while every sender is busy, filling meanwhile.
	Linger time.Duration
}

// Exporter coalesces concurrent Export and ExportGroup calls into stream
// requests of up to MaxBatch events per account: one batcher per account
// packs whole units (one lane's group, or one Export) into a request, waits
// up to Linger for it to fill, and hands it to one of Senders senders. A
// unit is never split across requests unless it alone exceeds MaxBatch
// (then its parts are sent one after another), so a lane never has two
// requests in flight. Safe for concurrent use; Close stops its goroutines.
type Exporter struct {
	c        *Client
	mode     identity.Mode
	senders  int
	maxBatch int
	linger   time.Duration
	timeout  time.Duration

	mu     sync.Mutex
	queues map[string]chan *unit
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

var (
	_ deliverer.Exporter      = (*Exporter)(nil)
	_ deliverer.GroupExporter = (*Exporter)(nil)
)

type pending struct {
	req   deliverer.Request
	reply chan deliverer.Result // buffered 1
}

// unit is what one caller queues: events sent in one request (at most
// maxBatch of them).
type unit struct {
	ctx   context.Context
	items []*pending
}

// New returns an Exporter. Errors wrap ErrInvalidConfig.
func New(cfg Config) (*Exporter, error) {
	c, err := NewClient(cfg.Client)
	if err != nil {
		return nil, err
	}
	if cfg.Senders == 0 {
		cfg.Senders = 8
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = MaxEvents
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.Senders < 1 || cfg.Senders > 1024 || cfg.MaxBatch < 1 || cfg.MaxBatch > MaxEvents || cfg.Linger < 0 || cfg.Linger > MaxLinger {
		return nil, fmt.Errorf("%w: senders %d (1..1024), max batch %d (1..%d), linger %s (0..%s)", ErrInvalidConfig,
			cfg.Senders, cfg.MaxBatch, MaxEvents, cfg.Linger, MaxLinger)
	}
	return &Exporter{c: c, mode: stripeexport.KeyMode(cfg.Client.APIKey), senders: cfg.Senders, maxBatch: cfg.MaxBatch,
		linger: cfg.Linger, timeout: cfg.Client.Timeout, queues: map[string]chan *unit{}, stop: make(chan struct{})}, nil
}

// Client returns the exporter's client (session refresh count).
func (x *Exporter) Client() *Client { return x.c }

// Name returns outbox.DefaultExporter: the stream sends the same items, keys
// and subjects as the v1 exporter.
func (x *Exporter) Name() string { return outbox.DefaultExporter }

// Mode returns the API key's mode.
func (x *Exporter) Mode() identity.Mode { return x.mode }

// Close stops the batchers and senders; Export calls after Close answer
// retry.
func (x *Exporter) Close() {
	x.mu.Lock()
	if !x.closed {
		x.closed = true
		close(x.stop)
	}
	x.mu.Unlock()
	x.wg.Wait()
}

// ToEvent returns r as a stream event: identifier = the item's key, payload
// {customer_key: customer, value_key: value as a decimal string}, the
// timestamp in RFC 3339 at second precision (v1 sends the same second as
// Unix seconds). A pure function of r.
func ToEvent(r deliverer.Request) Event {
	return Event{EventName: r.EventName, Identifier: r.Key,
		Payload:   map[string]string{r.CustomerKey: r.Customer, r.ValueKey: strconv.FormatInt(r.Value, 10)},
		Timestamp: time.Unix(r.Timestamp.Unix(), 0).UTC().Format(time.RFC3339)}
}

// Export queues r for its account's next stream request and waits for its
// result or ctx's end (then retry: the batch may still land, and the resend
// carries the same identifier).
func (x *Exporter) Export(ctx context.Context, r deliverer.Request) deliverer.Result {
	return x.ExportGroup(ctx, []deliverer.Request{r})[0]
}

// ExportGroup sends rs (one lane: one account) in one stream request with
// other callers' events, or, when rs has more than MaxBatch, in
// consecutive requests of MaxBatch; it returns one result per request, in
// order. An item whose answer has not come by ctx's end is a retry (the
// request may still land; the resend carries the same identifier).
func (x *Exporter) ExportGroup(ctx context.Context, rs []deliverer.Request) []deliverer.Result {
	out := make([]deliverer.Result, len(rs))
	for off := 0; off < len(rs); off += x.maxBatch {
		part := rs[off:min(off+x.maxBatch, len(rs))]
		x.exportUnit(ctx, part, out[off:off+len(part)])
	}
	return out
}

// exportUnit queues rs (at most maxBatch) as one unit and fills out.
func (x *Exporter) exportUnit(ctx context.Context, rs []deliverer.Request, out []deliverer.Result) {
	var q chan *unit
	if len(rs) > 0 {
		q = x.queue(rs[0].Account)
	}
	if q == nil {
		for i := range out {
			out[i] = deliverer.Result{Outcome: deliverer.OutcomeRetry, Rule: "stream_closed", ErrorCode: "closed"}
		}
		return
	}
	u := &unit{ctx: ctx, items: make([]*pending, len(rs))}
	for i, r := range rs {
		u.items[i] = &pending{req: r, reply: make(chan deliverer.Result, 1)}
	}
	select {
	case q <- u:
	case <-ctx.Done():
		for i := range out {
			out[i] = deliverer.Result{Outcome: deliverer.OutcomeRetry, Rule: "stream_timeout", ErrorCode: stripeexport.TransportTimeout, Message: "not sent before the deadline"}
		}
		return
	}
	for i, p := range u.items {
		select {
		case out[i] = <-p.reply:
		case <-ctx.Done():
			out[i] = deliverer.Result{Outcome: deliverer.OutcomeRetry, Rule: "stream_timeout", ErrorCode: stripeexport.TransportTimeout, Message: "no answer before the deadline"}
		}
	}
}

// queue returns account's queue, starting its batcher and senders on first
// use.
func (x *Exporter) queue(account string) chan *unit {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	q := x.queues[account]
	if q == nil {
		q = make(chan *unit, x.senders*x.maxBatch)
		x.queues[account] = q
		work := make(chan []*unit)
		x.wg.Add(1 + x.senders)
		go x.batcher(q, work)
		for range x.senders {
			go x.sender(account, work)
		}
	}
	return q
}

// batcher packs whole units from q into requests of at most maxBatch
// events and hands each to a sender on work. A request is ready when full
// or linger after its first unit; while no sender is free it keeps taking
// units that fit. A unit that does not fit starts the next request. On
// stop every unit not handed over is answered retry and work is closed.
func (x *Exporter) batcher(q chan *unit, work chan []*unit) {
	defer x.wg.Done()
	defer close(work)
	var (
		batch []*unit
		n     int         // events in batch
		carry *unit       // the unit that did not fit
		timer *time.Timer // linger of batch
		ready bool
	)
	closeAll := func() {
		for _, u := range batch {
			answerClosed(u)
		}
		if carry != nil {
			answerClosed(carry)
		}
		for {
			select {
			case u := <-q:
				answerClosed(u)
			default:
				return
			}
		}
	}
	add := func(u *unit) {
		if len(batch) == 0 {
			if timer == nil {
				timer = time.NewTimer(x.linger)
			} else {
				timer.Reset(x.linger)
			}
			ready = false
		}
		batch = append(batch, u)
		n += len(u.items)
		if n >= x.maxBatch {
			ready = true
		}
	}
	for {
		if len(batch) == 0 {
			if carry != nil {
				add(carry)
				carry = nil
				continue
			}
			select {
			case <-x.stop:
				closeAll()
				return
			case u := <-q:
				add(u)
			}
			continue
		}
		var in chan *unit // nil: take nothing more
		if carry == nil && n < x.maxBatch {
			in = q
		}
		var out chan []*unit // nil: not ready yet
		var linger <-chan time.Time
		if ready {
			out = work
		} else {
			linger = timer.C
		}
		select {
		case <-x.stop:
			closeAll()
			return
		case <-linger:
			ready = true
		case u := <-in:
			if n+len(u.items) > x.maxBatch {
				carry, ready = u, true
			} else {
				add(u)
			}
		case out <- batch:
			timer.Stop() // Go ≥ 1.23: no stale value is received after Stop or Reset
			batch, n = nil, 0
		}
	}
}

func answerClosed(u *unit) {
	for _, p := range u.items {
		p.reply <- deliverer.Result{Outcome: deliverer.OutcomeRetry, Rule: "stream_closed", ErrorCode: "closed"}
	}
}

// sender sends each request it is handed as one call; the items whose
// caller gave up meanwhile are left out (their caller answers retry).
func (x *Exporter) sender(account string, work <-chan []*unit) {
	defer x.wg.Done()
	for units := range work {
		var live []*pending
		for _, u := range units {
			if u.ctx.Err() != nil {
				continue
			}
			live = append(live, u.items...)
		}
		if len(live) > 0 {
			x.deliver(account, live, 0)
		}
	}
}

// deliver sends batch (one request) and answers every item by Rules.
// sessions counts the new sessions this batch already asked for.
func (x *Exporter) deliver(account string, batch []*pending, sessions int) {
	ctx, cancel := context.WithTimeout(context.Background(), x.timeout)
	defer cancel()
	tok, err := x.c.token(ctx, account)
	if err != nil {
		a := err.(*SessionError).Answer
		x.answerAll(batch, a, sessionRule(a))
		return
	}
	evs := make([]Event, len(batch))
	for i, p := range batch {
		evs[i] = ToEvent(p.req)
	}
	a := x.c.send(ctx, tok, evs)
	rule := Classify(a)
	switch rule.Action {
	case ActAccept:
		for _, p := range batch {
			ref := a.RequestID
			if ref == "" {
				ref = p.req.Key
			}
			p.reply <- deliverer.Result{Outcome: deliverer.OutcomeAccepted, Rule: "stream_" + rule.Name, HTTPStatus: a.Status,
				RequestID: a.RequestID, ProviderRef: ref}
		}
	case ActNewSession:
		x.c.invalidate(account, tok)
		if sessions < 2 {
			x.deliver(account, batch, sessions+1)
			return
		}
		if rule.Name == "session_expired" { // never quarantined for an expired session
			x.answerAll(batch, a, Rule{Name: rule.Name, Action: ActRetry})
			return
		}
		x.answerAll(batch, a, Rule{Name: rule.Name, Action: ActPerItem})
	case ActSplit:
		if len(batch) == 1 {
			x.answerAll(batch, a, Rule{Name: rule.Name, Action: ActPerItem})
			return
		}
		half := len(batch) / 2
		x.deliver(account, batch[:half], sessions)
		x.deliver(account, batch[half:], sessions)
	default:
		x.answerAll(batch, a, rule)
	}
}

// sessionRule classifies a failed session creation: a refused key is the
// account's problem (v1 table, quarantined account_unconfirmed); anything
// else is retried per item.
func sessionRule(a stripeexport.Answer) Rule {
	if a.Status == 401 || a.Status == 403 {
		return Rule{Name: "session_refused", Action: ActPerItem}
	}
	return Rule{Name: "session_failed", Action: ActRetry}
}

// answerAll gives every item of batch the result of rule's action for a.
func (x *Exporter) answerAll(batch []*pending, a stripeexport.Answer, rule Rule) {
	res := deliverer.Result{Rule: "stream_" + rule.Name, HTTPStatus: a.Status, RequestID: a.RequestID,
		ErrorCode: a.Code, Message: a.Message}
	if a.Status == 0 {
		res.ErrorCode = a.Transport
	}
	switch rule.Action {
	case ActRetry:
		res.Outcome = deliverer.OutcomeRetry
	case ActUncertain:
		res.Outcome = deliverer.OutcomeUncertain
	default: // ActPerItem: the v1 table on this answer
		v1 := stripeexport.Classify(a)
		res.Outcome, res.Reason = v1.Outcome, v1.Reason
		res.Rule += "/" + v1.Name
	}
	for _, p := range batch {
		r := res
		if r.Outcome == deliverer.OutcomeAccepted { // the v1 duplicate rule
			r.ProviderRef = p.req.Key
		}
		p.reply <- r
	}
}

// Router sends each item with the exporter its account chose
// (deliverer.Request.Via): Stream for deliverer.ExporterStream, V1
// otherwise.
type Router struct {
	V1     deliverer.Exporter
	Stream deliverer.Exporter
}

var (
	_ deliverer.Exporter      = Router{}
	_ deliverer.GroupExporter = Router{}
	_ deliverer.Canceller     = Router{}
)

// Cancel cancels a meter event through V1 for either exporter's accounts:
// the v2 stream has no adjustments, and Stripe cancels a stream event by
// its identifier like a v1 one. A V1 that cannot cancel quarantines
// provider_configuration (rule cancel_unsupported).
func (r Router) Cancel(ctx context.Context, req deliverer.CancelRequest) deliverer.Result {
	if c, ok := r.V1.(deliverer.Canceller); ok {
		return c.Cancel(ctx, req)
	}
	return deliverer.Result{Outcome: deliverer.OutcomeQuarantined, Reason: outbox.ReasonProviderConfiguration, Rule: "cancel_unsupported"}
}

// Name returns V1's name (both serve outbox.DefaultExporter).
func (r Router) Name() string { return r.V1.Name() }

// Mode returns V1's mode (both use the same key).
func (r Router) Mode() identity.Mode { return r.V1.Mode() }

// Export routes req.
func (r Router) Export(ctx context.Context, req deliverer.Request) deliverer.Result {
	if req.Via == deliverer.ExporterStream && r.Stream != nil {
		return r.Stream.Export(ctx, req)
	}
	return r.V1.Export(ctx, req)
}

// ExportGroup sends rs (one lane) as a unit: with Stream's ExportGroup when
// they go by the stream and Stream is a deliverer.GroupExporter; stream
// items of a Stream that is not go by concurrent Export calls (it
// coalesces them); v1 items one Export after another (one call at a time
// per lane).
func (r Router) ExportGroup(ctx context.Context, rs []deliverer.Request) []deliverer.Result {
	stream := r.Stream != nil && len(rs) > 0 && allVia(rs, deliverer.ExporterStream)
	if g, ok := r.Stream.(deliverer.GroupExporter); ok && stream {
		return g.ExportGroup(ctx, rs)
	}
	out := make([]deliverer.Result, len(rs))
	if stream {
		var wg sync.WaitGroup
		for i, req := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = r.Stream.Export(ctx, req)
			}()
		}
		wg.Wait()
		return out
	}
	for i, req := range rs {
		out[i] = r.Export(ctx, req)
	}
	return out
}

func allVia(rs []deliverer.Request, via string) bool {
	for _, r := range rs {
		if r.Via != via {
			return false
		}
	}
	return true
}
