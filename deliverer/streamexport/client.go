// Package streamexport sends outbox items to Stripe's v2 meter event stream
// in batches of up to 100 events and classifies each answer with one table
// (Rules). It implements deliverer.GroupExporter: concurrent ExportGroup
// (one lane's group) and Export calls, from many lanes, are packed whole
// into one stream request per account, waiting at most Config.Linger for
// it to fill, and each item gets its own Result.
//
// The client is our own (Client): two endpoints, one JSON body, one header.
// stripe-go v76 (pinned) has no v2 API, and v82's typed calls leave the
// session token to the caller anyway (docs/deliverer.md, "The v2 meter event
// stream"). Nothing here logs; the session token is never logged, printed
// or stored outside the Client.
package streamexport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aurora-billing/aurora/deliverer/stripeexport"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of ClientConfig.
const (
	// DefaultStreamBase is Stripe's meter event stream host (Stripe's API reference: v2 stream calls go to meter-events.stripe.com, not api.stripe.com).
	DefaultStreamBase = "https://meter-events.stripe.com"
	// StripeVersion is sent on both v2 calls. Which version Stripe's v2
	// endpoints require is not documented by Stripe (unknown); this is the
	// version stripe-go v82 sends with its typed v2 calls.
	StripeVersion = "2025-03-31.basil"
	// RefreshMargin: a token is replaced this long before it expires, so a
	// request never starts with a token about to expire.
	RefreshMargin = time.Minute
	// MaxEvents is Stripe's "up to 100 events per request".
	MaxEvents = 100
)

// ClientConfig configures a Client.
type ClientConfig struct {
	APIKey     string        // the secret key (session endpoint); never logged
	APIBase    string        // session host, e.g. https://api.stripe.com or the emulator
	StreamBase string        // stream host; "" = APIBase when it is not Stripe's, else DefaultStreamBase
	Timeout    time.Duration // HTTP client timeout of one call (> 0)
	MaxConns   int           // idle keep-alive connections per host
	// Now is the clock for token refresh (tests: clock.Manual). Default time.Now.
	Now func() time.Time
	// Registerer receives aurora_deliverer_stream_session_refreshes_total
	// (nil: not registered).
	Registerer prometheus.Registerer
}

// Event is one event of a stream request (the wire shape).
type Event struct {
	EventName  string            `json:"event_name"`
	Identifier string            `json:"identifier"`
	Payload    map[string]string `json:"payload"`
	Timestamp  string            `json:"timestamp"` // RFC 3339, UTC, seconds
}

// Client calls the two v2 endpoints and keeps one session token per
// account. Safe for concurrent use.
type Client struct {
	key, apiBase, streamBase string
	http                     *http.Client
	now                      func() time.Time
	refreshes                prometheus.Counter
	created                  atomic.Int64

	mu       sync.Mutex
	sessions map[string]*tokenState // per account
}

type tokenState struct {
	mu      sync.Mutex // one session creation at a time per account
	token   string
	refresh time.Time // our clock: replace the token from then on
}

// ErrInvalidConfig is wrapped by NewClient's errors.
var ErrInvalidConfig = errors.New("streamexport: invalid configuration")

// NewClient returns a Client for cfg. Errors wrap ErrInvalidConfig (the
// key's value is never included).
func NewClient(cfg ClientConfig) (*Client, error) {
	if stripeexport.KeyMode(cfg.APIKey) == "" {
		return nil, fmt.Errorf("%w: the API key is not a Stripe secret or restricted key", ErrInvalidConfig)
	}
	if cfg.APIBase == "" {
		cfg.APIBase = stripeexport.DefaultAPIBase
	}
	if cfg.StreamBase == "" {
		cfg.StreamBase = DefaultStreamBase
		if strings.TrimRight(cfg.APIBase, "/") != stripeexport.DefaultAPIBase {
			cfg.StreamBase = cfg.APIBase // the emulator serves both
		}
	}
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("%w: timeout %s must be positive", ErrInvalidConfig, cfg.Timeout)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = max(100, cfg.MaxConns)
	tr.MaxIdleConnsPerHost = max(2, cfg.MaxConns)
	c := &Client{
		key: cfg.APIKey, apiBase: strings.TrimRight(cfg.APIBase, "/"), streamBase: strings.TrimRight(cfg.StreamBase, "/"),
		http: &http.Client{Timeout: cfg.Timeout, Transport: tr}, now: cfg.Now, sessions: map[string]*tokenState{},
		refreshes: prometheus.NewCounter(prometheus.CounterOpts{Name: "aurora_deliverer_stream_session_refreshes_total",
			Help: "v2 meter event sessions created (first token of an account, refresh before expiry, or after an expired answer)."}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(c.refreshes); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, fmt.Errorf("%w: metrics: %v", ErrInvalidConfig, err)
			}
			c.refreshes = are.ExistingCollector.(prometheus.Counter)
		}
	}
	return c, nil
}

// Refreshes returns how many sessions this client created.
func (c *Client) Refreshes() int64 { return c.created.Load() }

// SessionError is a failed session creation: the answer of the session
// endpoint.
type SessionError struct{ Answer stripeexport.Answer }

func (e *SessionError) Error() string {
	if e.Answer.Status == 0 {
		return "streamexport: meter event session: " + e.Answer.Transport
	}
	return fmt.Sprintf("streamexport: meter event session: http %d %s", e.Answer.Status, e.Answer.Code)
}

// token returns account's session token, creating one lazily and
// replacing it RefreshMargin before it expires. Errors: *SessionError.
func (c *Client) token(ctx context.Context, account string) (string, error) {
	c.mu.Lock()
	ts := c.sessions[account]
	if ts == nil {
		ts = &tokenState{}
		c.sessions[account] = ts
	}
	c.mu.Unlock()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.token != "" && c.now().Before(ts.refresh) {
		return ts.token, nil
	}
	tok, life, err := c.createSession(ctx)
	if err != nil {
		return "", err
	}
	c.refreshes.Inc()
	c.created.Add(1)
	// The lifetime is measured on Stripe's clock (expires_at − created)
	// and counted from our clock, so clock skew does not matter.
	ts.token, ts.refresh = tok, c.now().Add(max(life-RefreshMargin, life/2))
	return tok, nil
}

// invalidate forgets account's token if it is still tok (an expired
// answer): the next token call creates a session.
func (c *Client) invalidate(account, tok string) {
	c.mu.Lock()
	ts := c.sessions[account]
	c.mu.Unlock()
	if ts == nil {
		return
	}
	ts.mu.Lock()
	if ts.token == tok {
		ts.token = ""
	}
	ts.mu.Unlock()
}

type sessionJSON struct {
	AuthenticationToken string    `json:"authentication_token"`
	Created             time.Time `json:"created"`
	ExpiresAt           time.Time `json:"expires_at"`
}

func (c *Client) createSession(ctx context.Context) (string, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.apiBase+"/v2/billing/meter_event_session", nil)
	if err != nil {
		return "", 0, &SessionError{Answer: stripeexport.Answer{Transport: stripeexport.TransportConnection, Message: "bad request URL"}}
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	a, body := c.do(ctx, req)
	if a.Status != http.StatusOK {
		return "", 0, &SessionError{Answer: a}
	}
	var s sessionJSON
	if err := json.Unmarshal(body, &s); err != nil || s.AuthenticationToken == "" || !s.ExpiresAt.After(s.Created) {
		a.Status, a.Message = 0, "unreadable session answer"
		a.Transport = stripeexport.TransportConnection
		return "", 0, &SessionError{Answer: a}
	}
	return s.AuthenticationToken, s.ExpiresAt.Sub(s.Created), nil
}

// send posts events as one stream request with account's token and
// returns the answer (never retried here) and the token it used.
func (c *Client) send(ctx context.Context, tok string, events []Event) stripeexport.Answer {
	b, err := json.Marshal(struct {
		Events []Event `json:"events"`
	}{events})
	if err != nil { // strings only: cannot happen
		return stripeexport.Answer{Status: 0, Transport: stripeexport.TransportConnection, Message: "encode: " + err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.streamBase+"/v2/billing/meter_event_stream", bytes.NewReader(b))
	if err != nil {
		return stripeexport.Answer{Transport: stripeexport.TransportConnection, Message: "bad request URL"}
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	// No GetBody: net/http must not replay the request by itself on a
	// closed keep-alive connection; every attempt is the deliverer's.
	req.GetBody = nil
	a, _ := c.do(ctx, req)
	return a
}

// do runs req and reads the answer into an Answer (status, request id,
// Stripe's error object) and the body.
func (c *Client) do(ctx context.Context, req *http.Request) (stripeexport.Answer, []byte) {
	req.Header.Set("Stripe-Version", StripeVersion)
	req.Header.Set("User-Agent", "aurora-deliverer")
	res, err := c.http.Do(req)
	if err != nil {
		return transportAnswer(ctx, err), nil
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil { // headers came, the body broke: like a dropped connection
		a := transportAnswer(ctx, err)
		a.RequestID = res.Header.Get("Request-Id")
		return a, nil
	}
	a := stripeexport.Answer{Status: res.StatusCode, RequestID: res.Header.Get("Request-Id")}
	if res.StatusCode >= 300 {
		var eb struct {
			Error struct {
				Type    string `json:"type"`
				Code    string `json:"code"`
				Param   string `json:"param"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(body, &eb) == nil {
			a.Type, a.Code, a.Param, a.Message = eb.Error.Type, eb.Error.Code, eb.Error.Param, eb.Error.Message
		} else {
			a.Message = "unreadable answer"
		}
	}
	return a, body
}

func transportAnswer(ctx context.Context, err error) stripeexport.Answer {
	a := stripeexport.Answer{Transport: stripeexport.TransportConnection}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()) {
		a.Transport = stripeexport.TransportTimeout
	}
	var op *net.OpError
	switch {
	case errors.As(err, &op):
		a.Message = fmt.Sprintf("%s: %v", op.Op, op.Err)
	default:
		msg := err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
		a.Message = msg
	}
	return a
}
