package stripeemulator

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Faults are the random faults injected into `POST /v1/billing/meter_events`
// (the export path; other endpoints are never faulted). Rates are
// probabilities in 0..1 whose sum is at most 1; each request draws one
// uniform number and falls into at most one fault.
//
// Decisions are deterministic: the n-th request carrying identifier X that
// passes the concurrency limiter draws from SHA-256(seed, X, n), so the same
// seed and the same per-identifier request sequence give the same faults
// however requests interleave.
type Faults struct {
	// Latency is added to every meter event request, while the (customer,
	// meter) concurrency slot is held. Zero: none.
	Latency time.Duration
	// LatencyMax, when greater than Latency, makes the latency uniform in
	// [Latency, LatencyMax].
	LatencyMax time.Duration
	// HTTP429 answers 429 rate_limit without processing (not saved under
	// the Idempotency-Key, as at Stripe).
	HTTP429 float64
	// HTTP500 answers 500 api_error before the request is processed and
	// saves nothing under the Idempotency-Key: a retry with the same key is
	// processed normally. This models a failure in front of Stripe's
	// idempotency layer.
	HTTP500 float64
	// HTTP500Saved answers 500 api_error without applying the event and
	// SAVES that 500 under the Idempotency-Key, as Stripe does once
	// execution has begun: a retry with the same key and parameters replays
	// the 500 until the key expires.
	HTTP500Saved float64
	// DropAfterApply processes the request fully (applies the event, saves
	// the idempotent result), then closes the connection without writing a
	// byte of the response.
	DropAfterApply float64
	// CutAfterApply processes the request fully, then sends the status line,
	// the headers and half of the body, and closes the connection. Unlike
	// DropAfterApply, no HTTP client retries this by itself: the caller
	// always sees a transport error (see docs, "Go's HTTP client").
	CutAfterApply float64
	// Timeout holds the request without processing it until the client
	// gives up (or Config.TimeoutHold passes), then closes the connection.
	Timeout float64
}

// fault names as written in a specification ("drop-after-apply=0.1,…").
const (
	faultLatency        = "latency"
	faultHTTP429        = "http429"
	faultHTTP500        = "http500"
	faultHTTP500Saved   = "http500-saved"
	faultDropAfterApply = "drop-after-apply"
	faultCutAfterApply  = "cut-after-apply"
	faultTimeout        = "timeout"
)

// ParseFaults parses the demo's `--faults` syntax: comma-separated
// name=value items, e.g.
//
//	drop-after-apply=0.1,http500=0.1,http429=0.1,latency=20ms
//
// Names: latency (a Go duration "20ms", or a range "10ms-50ms"), http429,
// http500, http500-saved, drop-after-apply, cut-after-apply, timeout (rates
// in 0..1). The
// empty string is no faults. Any bad item is a *FaultSpecError (wrapping
// ErrInvalidFaults) naming it: unknown name, missing "=", repeated name,
// rate outside 0..1 or not a number, negative or inverted latency, rates
// summing above 1.
func ParseFaults(spec string) (Faults, error) {
	var f Faults
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return f, nil
	}
	seen := map[string]bool{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		name, value, ok := strings.Cut(item, "=")
		if !ok || name == "" || value == "" {
			return Faults{}, &FaultSpecError{Item: item, Reason: "want name=value"}
		}
		if seen[name] {
			return Faults{}, &FaultSpecError{Item: item, Reason: "repeated"}
		}
		seen[name] = true
		if name == faultLatency {
			lo, hi, err := parseLatency(value)
			if err != nil {
				return Faults{}, &FaultSpecError{Item: item, Reason: err.Error()}
			}
			f.Latency, f.LatencyMax = lo, hi
			continue
		}
		var dst *float64
		switch name {
		case faultHTTP429:
			dst = &f.HTTP429
		case faultHTTP500:
			dst = &f.HTTP500
		case faultHTTP500Saved:
			dst = &f.HTTP500Saved
		case faultDropAfterApply:
			dst = &f.DropAfterApply
		case faultCutAfterApply:
			dst = &f.CutAfterApply
		case faultTimeout:
			dst = &f.Timeout
		default:
			return Faults{}, &FaultSpecError{Item: item, Reason: "unknown fault; want one of latency, http429, http500, http500-saved, drop-after-apply, cut-after-apply, timeout"}
		}
		r, err := strconv.ParseFloat(value, 64)
		if err != nil || math.IsNaN(r) || r < 0 || r > 1 {
			return Faults{}, &FaultSpecError{Item: item, Reason: "rate must be a number within 0..1"}
		}
		*dst = r
	}
	if err := f.Validate(); err != nil {
		return Faults{}, err
	}
	return f, nil
}

func parseLatency(v string) (lo, hi time.Duration, err error) {
	a, b, isRange := strings.Cut(v, "-")
	lo, err = time.ParseDuration(a)
	if err != nil {
		return 0, 0, fmt.Errorf("latency must be a duration like 20ms or a range like 10ms-50ms")
	}
	hi = lo
	if isRange {
		hi, err = time.ParseDuration(b)
		if err != nil {
			return 0, 0, fmt.Errorf("latency must be a duration like 20ms or a range like 10ms-50ms")
		}
	}
	if lo < 0 || hi < lo {
		return 0, 0, fmt.Errorf("latency must be non-negative and a range must not be inverted")
	}
	return lo, hi, nil
}

// Validate checks rates (each in 0..1, sum ≤ 1) and latencies (non-negative,
// LatencyMax zero or ≥ Latency). Errors are *FaultSpecError.
func (f Faults) Validate() error {
	rates := []struct {
		name string
		v    float64
	}{
		{faultHTTP429, f.HTTP429}, {faultHTTP500, f.HTTP500}, {faultHTTP500Saved, f.HTTP500Saved},
		{faultDropAfterApply, f.DropAfterApply}, {faultCutAfterApply, f.CutAfterApply}, {faultTimeout, f.Timeout},
	}
	sum := 0.0
	for _, r := range rates {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return &FaultSpecError{Item: fmt.Sprintf("%s=%v", r.name, r.v), Reason: "rate must be a number within 0..1"}
		}
		sum += r.v
	}
	if sum > 1+1e-9 {
		return &FaultSpecError{Item: f.String(), Reason: "rates sum above 1"}
	}
	if f.Latency < 0 || (f.LatencyMax != 0 && f.LatencyMax < f.Latency) {
		return &FaultSpecError{Item: fmt.Sprintf("latency=%s-%s", f.Latency, f.LatencyMax), Reason: "latency must be non-negative and a range must not be inverted"}
	}
	return nil
}

// String renders f in ParseFaults syntax (zero items omitted).
func (f Faults) String() string {
	var parts []string
	if f.Latency > 0 || f.LatencyMax > 0 {
		if f.LatencyMax > f.Latency {
			parts = append(parts, fmt.Sprintf("%s=%s-%s", faultLatency, f.Latency, f.LatencyMax))
		} else {
			parts = append(parts, fmt.Sprintf("%s=%s", faultLatency, f.Latency))
		}
	}
	for _, r := range []struct {
		name string
		v    float64
	}{
		{faultHTTP429, f.HTTP429}, {faultHTTP500, f.HTTP500}, {faultHTTP500Saved, f.HTTP500Saved},
		{faultDropAfterApply, f.DropAfterApply}, {faultCutAfterApply, f.CutAfterApply}, {faultTimeout, f.Timeout},
	} {
		if r.v != 0 {
			parts = append(parts, r.name+"="+strconv.FormatFloat(r.v, 'g', -1, 64))
		}
	}
	return strings.Join(parts, ",")
}

// AnswerKind is how the emulator answers one meter event request.
type AnswerKind string

const (
	// AnswerNormal processes the request with no fault.
	AnswerNormal AnswerKind = "ok"
	// AnswerHTTP429 is 429 rate_limit, not processed, not saved.
	AnswerHTTP429 AnswerKind = "429"
	// AnswerHTTP500 is 500 api_error before processing, not saved.
	AnswerHTTP500 AnswerKind = "500"
	// AnswerHTTP500Saved is 500 api_error, not applied, saved under the
	// Idempotency-Key (replayed to retries with the same key).
	AnswerHTTP500Saved AnswerKind = "500-saved"
	// AnswerHTTP409 is 409 idempotency_key_in_use, not processed.
	AnswerHTTP409 AnswerKind = "409"
	// AnswerHTTP400 is 400 invalid_request_error with Answer.Code, not
	// processed.
	AnswerHTTP400 AnswerKind = "400"
	// AnswerHTTP401 is 401 (invalid API key), not processed.
	AnswerHTTP401 AnswerKind = "401"
	// AnswerHTTP403 is 403 (key lacks permission), not processed.
	AnswerHTTP403 AnswerKind = "403"
	// AnswerDrop closes the connection before processing.
	AnswerDrop AnswerKind = "drop"
	// AnswerDropAfterApply processes fully, then closes the connection
	// without a response.
	AnswerDropAfterApply AnswerKind = "drop-after-apply"
	// AnswerCutAfterApply processes fully, then sends the headers and half
	// the body and closes the connection.
	AnswerCutAfterApply AnswerKind = "cut-after-apply"
	// AnswerSessionExpired is the stream's billing_meter_event_session_expired
	// (Config.SessionExpiredStatus), not processed; on v1 it is a 401.
	AnswerSessionExpired AnswerKind = "session-expired"
	// AnswerTimeout holds the request unprocessed until the client gives up
	// (or Config.TimeoutHold), then closes the connection.
	AnswerTimeout AnswerKind = "timeout"
)

// Answer is one scripted answer. Code is used by AnswerHTTP400 only.
type Answer struct {
	Kind AnswerKind
	Code string
}

// String renders a in ParseAnswer syntax.
func (a Answer) String() string {
	if a.Kind == AnswerHTTP400 && a.Code != "" {
		return "400:" + a.Code
	}
	return string(a.Kind)
}

// ParseAnswer parses one scripted answer: "ok" (or "200"), "429", "500",
// "500-saved", "409", "400:<code>" (e.g. "400:no_meter"; bare "400" uses
// parameter_invalid_string), "401", "403", "drop", "drop-after-apply",
// "cut-after-apply", "timeout". Anything else is an *AnswerError wrapping ErrInvalidAnswer.
func ParseAnswer(s string) (Answer, error) {
	s = strings.TrimSpace(s)
	if code, ok := strings.CutPrefix(s, "400:"); ok {
		if code == "" {
			return Answer{}, &AnswerError{Answer: s, Reason: "empty error code"}
		}
		return Answer{Kind: AnswerHTTP400, Code: code}, nil
	}
	switch k := AnswerKind(s); k {
	case "200":
		return Answer{Kind: AnswerNormal}, nil
	case AnswerNormal, AnswerHTTP429, AnswerHTTP500, AnswerHTTP500Saved, AnswerHTTP409,
		AnswerHTTP401, AnswerHTTP403, AnswerSessionExpired, AnswerDrop, AnswerDropAfterApply, AnswerCutAfterApply, AnswerTimeout:
		return Answer{Kind: k}, nil
	case AnswerHTTP400:
		return Answer{Kind: AnswerHTTP400, Code: CodeParameterInvalid}, nil
	}
	return Answer{}, &AnswerError{Answer: s, Reason: "want ok, 200, 400:<code>, 401, 403, 409, 429, 500, 500-saved, session-expired, drop, drop-after-apply, cut-after-apply or timeout"}
}

// ParseAnswers parses a comma-separated queue of answers, e.g.
// "500,drop-after-apply,ok". Errors as ParseAnswer.
func ParseAnswers(s string) ([]Answer, error) {
	var out []Answer
	for _, part := range strings.Split(s, ",") {
		a, err := ParseAnswer(part)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// draw returns a uniform number in [0,1) from SHA-256(seed, salt, key, n).
func draw(seed uint64, salt, key string, n int) float64 {
	h := sha256.New()
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], seed)
	binary.BigEndian.PutUint64(b[8:], uint64(n))
	h.Write(b[:])
	h.Write([]byte(salt))
	h.Write([]byte{0})
	h.Write([]byte(key))
	sum := h.Sum(nil)
	return float64(binary.BigEndian.Uint64(sum[:8])>>11) / (1 << 53)
}

// decide picks the random fault for the n-th request of key.
func (f Faults) decide(seed uint64, key string, n int) Answer {
	u := draw(seed, "fault", key, n)
	for _, c := range []struct {
		p float64
		k AnswerKind
	}{
		{f.HTTP429, AnswerHTTP429}, {f.HTTP500, AnswerHTTP500}, {f.HTTP500Saved, AnswerHTTP500Saved},
		{f.DropAfterApply, AnswerDropAfterApply}, {f.CutAfterApply, AnswerCutAfterApply}, {f.Timeout, AnswerTimeout},
	} {
		if u < c.p {
			return Answer{Kind: c.k}
		}
		u -= c.p
	}
	return Answer{Kind: AnswerNormal}
}

// latency picks the latency of the n-th request of key.
func (f Faults) latency(seed uint64, key string, n int) time.Duration {
	if f.LatencyMax <= f.Latency {
		return f.Latency
	}
	span := float64(f.LatencyMax - f.Latency)
	return f.Latency + time.Duration(draw(seed, "latency", key, n)*span)
}
