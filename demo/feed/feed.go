// Package feed turns usage input into usage events for the demo and for
// replays: Apache/nginx access logs (common or combined format), a JSONL
// usage format, or a deterministic generator.
//
// Access logs: each request is one unit of api_calls, and its response
// bytes are egress_bytes (a "-" byte count is zero and stages no egress
// event). The client host becomes a tenant, anonymised stably as
// "tn_" + the first 12 hex characters of SHA-256("aurora-demo-tenant:" +
// host), so no address reaches the database, the logs or Stripe. Event ids
// are "<source>:<line>:<feature>", so replaying the same file is idempotent.
//
// JSONL: one object per line:
//
//	{"tenant":"org_123","event_id":"req-1","feature":"api_calls","quantity":1,
//	 "timestamp":"2026-09-01T10:00:00Z"}
//
// with an optional "corrects":"<event_id>" making it a correction.
//
// A JSONL line is one JSON object and nothing after it, in valid UTF-8
// (invalid bytes are refused, never replaced). Every event a line yields is
// checked with usage.Event.Validate (text bounds, no NUL, quantities within
// 15 significant digits); a line that fails is malformed as a whole.
//
// A malformed line is counted and reported with its line number and reason
// (the first MaxReported), never staged, and never aborts the read.
package feed

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aurora-billing/aurora/shared/usage"
)

// Features produced by access logs.
const (
	FeatureAPICalls    = "api_calls"
	FeatureEgressBytes = "egress_bytes"
)

// MaxReported is how many malformed lines are kept with their line numbers
// and reasons (all of them are counted).
const MaxReported = 20

// Format of an input.
type Format string

const (
	FormatAccessLog Format = "access-log"
	FormatJSONL     Format = "jsonl"
)

// ErrUnknownFormat: the input is neither an access log nor JSONL.
var ErrUnknownFormat = errors.New("feed: unknown input format")

// Malformed is one rejected input line.
type Malformed struct {
	Line   int    `json:"line"`
	Reason string `json:"reason"`
}

// Result is what a read produced.
type Result struct {
	Events         []usage.Event
	EventLines     []int       // EventLines[i] is the 1-based input line of Events[i] (the generator: its request number)
	Lines          int         // lines read, blank lines excluded
	MalformedLines int         // lines rejected
	FirstMalformed []Malformed // the first MaxReported rejected lines
	Tenants        int         // distinct tenants
}

func (r *Result) reject(line int, reason string) {
	r.MalformedLines++
	if len(r.FirstMalformed) < MaxReported {
		r.FirstMalformed = append(r.FirstMalformed, Malformed{Line: line, Reason: reason})
	}
}

func (r *Result) add(line int, evs ...usage.Event) {
	for _, ev := range evs {
		r.Events = append(r.Events, ev)
		r.EventLines = append(r.EventLines, line)
	}
}

// LineOf returns the input line of Events[i] (0 when unknown).
func (r *Result) LineOf(i int) int {
	if i < 0 || i >= len(r.EventLines) {
		return 0
	}
	return r.EventLines[i]
}

func (r *Result) countTenants() {
	seen := map[string]struct{}{}
	for _, e := range r.Events {
		seen[e.Tenant] = struct{}{}
	}
	r.Tenants = len(seen)
}

// Rebase shifts every timestamp by the same amount so the newest lands at
// now; relative order and spacing are kept.
func (r *Result) Rebase(now time.Time) {
	var newest time.Time
	for _, e := range r.Events {
		if e.OccurredAt.After(newest) {
			newest = e.OccurredAt
		}
	}
	if newest.IsZero() {
		return
	}
	shift := now.Sub(newest)
	for i := range r.Events {
		r.Events[i].OccurredAt = r.Events[i].OccurredAt.Add(shift).Truncate(time.Second)
	}
}

// Detect guesses the format from up to the first 20 non-blank lines of head:
// JSONL when more of them start with "{" than parse as access-log lines,
// otherwise an access log. A malformed first line therefore does not decide
// the format of the whole file.
func Detect(head []byte) Format {
	jsonLike, accessLike, seen := 0, 0, 0
	for _, line := range bytes.Split(head, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) == 0 {
			continue
		}
		if t[0] == '{' {
			jsonLike++
		} else if _, err := ParseAccessLine(string(t)); err == nil {
			accessLike++
		}
		if seen++; seen == 20 {
			break
		}
	}
	if jsonLike > accessLike {
		return FormatJSONL
	}
	return FormatAccessLog
}

// DetectFile is Detect, except that a .jsonl or .ndjson file name decides
// by itself.
func DetectFile(name string, head []byte) Format {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".jsonl", ".ndjson":
		return FormatJSONL
	}
	return Detect(head)
}

// Read parses r in format f; source names the input in event ids. Only I/O
// errors are returned; bad lines are counted in the Result.
func Read(r io.Reader, f Format, source string) (*Result, error) {
	switch f {
	case FormatAccessLog:
		return readAccessLog(r, source)
	case FormatJSONL:
		return readJSONL(r)
	default:
		return nil, fmt.Errorf("%w: %q (want access-log or jsonl)", ErrUnknownFormat, string(f))
	}
}

// Tenant anonymises a client host (see the package documentation).
func Tenant(host string) string {
	sum := sha256.Sum256([]byte("aurora-demo-tenant:" + host))
	return "tn_" + hex.EncodeToString(sum[:6])
}

// MaxLineBytes is the longest input line read; a longer line is counted
// as malformed ("line longer than …") and skipped, never aborting the run.
const MaxLineBytes = 1 << 20

// eachLine calls fn with every line of r (without its newline) and its
// 1-based number; a line longer than MaxLineBytes is passed as nil with
// tooLong set (its bytes are skipped). Only I/O errors are returned.
func eachLine(r io.Reader, fn func(n int, line []byte, tooLong bool)) error {
	br := bufio.NewReaderSize(r, 64*1024)
	var buf []byte
	for n := 1; ; n++ {
		buf = buf[:0]
		tooLong := false
		for {
			chunk, err := br.ReadSlice('\n')
			if !tooLong && len(buf)+len(chunk) > MaxLineBytes+1 { // +1: the newline
				tooLong, buf = true, buf[:0]
			}
			if !tooLong {
				buf = append(buf, chunk...)
			}
			switch {
			case err == bufio.ErrBufferFull:
				continue
			case err == io.EOF:
				if len(buf) > 0 || tooLong {
					fn(n, bytes.TrimSuffix(buf, []byte("\n")), tooLong)
				}
				return nil
			case err != nil:
				return fmt.Errorf("feed: read line %d: %w", n, err)
			}
			break
		}
		if tooLong {
			fn(n, nil, true)
		} else {
			fn(n, bytes.TrimSuffix(buf, []byte("\n")), false)
		}
	}
}

func readAccessLog(r io.Reader, source string) (*Result, error) {
	res := &Result{}
	err := eachLine(r, func(n int, raw []byte, tooLong bool) {
		if tooLong {
			res.Lines++
			res.reject(n, fmt.Sprintf("line longer than %d bytes", MaxLineBytes))
			return
		}
		line := strings.TrimSpace(string(raw))
		if line == "" {
			return
		}
		res.Lines++
		rec, err := ParseAccessLine(line)
		if err != nil {
			res.reject(n, err.Error())
			return
		}
		tenant := Tenant(rec.Host)
		id := fmt.Sprintf("%s:%d:", source, n)
		evs := []usage.Event{{Tenant: tenant, EventID: id + FeatureAPICalls, Feature: FeatureAPICalls, Quantity: 1, OccurredAt: rec.Time}}
		if rec.Bytes > 0 {
			evs = append(evs, usage.Event{Tenant: tenant, EventID: id + FeatureEgressBytes, Feature: FeatureEgressBytes, Quantity: rec.Bytes, OccurredAt: rec.Time})
		}
		for _, ev := range evs {
			if err := ev.Validate(); err != nil {
				res.reject(n, err.Error())
				return
			}
		}
		res.add(n, evs...)
	})
	if err != nil {
		return nil, err
	}
	res.countTenants()
	return res, nil
}

// AccessRecord is the part of an access-log line aurora uses.
type AccessRecord struct {
	Host   string
	Time   time.Time
	Status int
	Bytes  int64 // 0 for "-"
}

const accessTimeLayout = "02/Jan/2006:15:04:05 -0700"

// ParseAccessLine parses one common/combined log line: host ident user
// [time] "request" status bytes ["referer" "user-agent"]. Referer and user
// agent are ignored (and may be truncated). Errors say which field is bad.
func ParseAccessLine(line string) (AccessRecord, error) {
	var rec AccessRecord
	host, rest, ok := strings.Cut(line, " ")
	if !ok || host == "" {
		return rec, errors.New("missing client host")
	}
	rec.Host = host
	open := strings.IndexByte(rest, '[')
	closeIdx := strings.IndexByte(rest, ']')
	if open < 0 || closeIdx < open {
		return rec, errors.New("missing [time]")
	}
	t, err := time.Parse(accessTimeLayout, rest[open+1:closeIdx])
	if err != nil {
		return rec, errors.New("bad time")
	}
	rec.Time = t.UTC()
	rest = strings.TrimSpace(rest[closeIdx+1:])
	if !strings.HasPrefix(rest, `"`) {
		return rec, errors.New("missing quoted request")
	}
	end := strings.Index(rest[1:], `" `)
	if end < 0 {
		return rec, errors.New("unterminated request")
	}
	rest = strings.TrimSpace(rest[end+2:])
	fields := strings.Fields(rest)
	if len(fields) < 2 {
		return rec, errors.New("missing status or bytes")
	}
	status, err := strconv.Atoi(fields[0])
	if err != nil || status < 100 || status > 599 {
		return rec, errors.New("bad status")
	}
	rec.Status = status
	if fields[1] != "-" {
		b, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil || b < 0 {
			return rec, errors.New("bad byte count")
		}
		rec.Bytes = b
	}
	return rec, nil
}

type jsonlRecord struct {
	Tenant    string  `json:"tenant"`
	EventID   string  `json:"event_id"`
	Feature   string  `json:"feature"`
	Quantity  *int64  `json:"quantity"`
	Timestamp string  `json:"timestamp"`
	Corrects  *string `json:"corrects"`
}

func readJSONL(r io.Reader) (*Result, error) {
	res := &Result{}
	err := eachLine(r, func(n int, raw []byte, tooLong bool) {
		if tooLong {
			res.Lines++
			res.reject(n, fmt.Sprintf("line longer than %d bytes", MaxLineBytes))
			return
		}
		line := bytes.TrimSpace(raw)
		if len(line) == 0 {
			return
		}
		res.Lines++
		rec, reason := decodeJSONLine(line)
		if reason != "" {
			res.reject(n, reason)
			return
		}
		if rec.Quantity == nil {
			res.reject(n, "missing quantity")
			return
		}
		ts, err := time.Parse(time.RFC3339, rec.Timestamp)
		if err != nil {
			res.reject(n, "timestamp must be RFC 3339")
			return
		}
		ev := usage.Event{Tenant: rec.Tenant, EventID: rec.EventID, Feature: rec.Feature, Quantity: *rec.Quantity, OccurredAt: ts.UTC()}
		if rec.Corrects != nil {
			ev.CorrectsEventID = *rec.Corrects
		}
		if err := ev.Validate(); err != nil {
			res.reject(n, err.Error())
			return
		}
		res.add(n, ev)
	})
	if err != nil {
		return nil, err
	}
	res.countTenants()
	return res, nil
}

// decodeJSONLine decodes one JSONL line (already trimmed, not empty) into
// a record, or returns why it is malformed. The reasons (invalid UTF-8, not
// an object, the decoder's syntax error offset, unknown or mistyped field
// name, trailing data) name no value from the line.
func decodeJSONLine(line []byte) (jsonlRecord, string) {
	var rec jsonlRecord
	if !utf8.Valid(line) {
		return rec, "line is not valid UTF-8"
	}
	if line[0] != '{' {
		return rec, "not a JSON object"
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return rec, "invalid JSON object: " + strings.TrimPrefix(err.Error(), "json: ")
	}
	if _, err := dec.Token(); err != io.EOF {
		return rec, "trailing data after the JSON object"
	}
	return rec, ""
}

// Generate returns a deterministic synthetic workload: events spread over
// the hour before now across tenants tn_gen_000…, each an api_calls unit,
// with egress_bytes on three of four requests. The same seed gives the same
// events (apart from the shift to now).
func Generate(seed uint64, tenants, requests int, now time.Time) *Result {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	res := &Result{Lines: requests}
	for i := range requests {
		tenant := fmt.Sprintf("tn_gen_%03d", rng.IntN(max(tenants, 1)))
		at := now.Add(-time.Duration(rng.Int64N(int64(time.Hour)))).Truncate(time.Second).UTC()
		id := fmt.Sprintf("gen-%d:%d:", seed, i)
		res.add(i+1, usage.Event{Tenant: tenant, EventID: id + FeatureAPICalls, Feature: FeatureAPICalls, Quantity: 1, OccurredAt: at})
		if rng.IntN(4) != 0 {
			res.add(i+1, usage.Event{Tenant: tenant, EventID: id + FeatureEgressBytes, Feature: FeatureEgressBytes, Quantity: 200 + rng.Int64N(200_000), OccurredAt: at})
		}
	}
	res.countTenants()
	return res
}
